// Attention against a naive fp64 softmax(QK^T/sqrt(HS)) V with a causal mask,
// on shapes that cross the 64-row block boundary and use grouped-query heads.

#include <gtest/gtest.h>

#include <cmath>

#include "core/tensor.h"
#include "kernel_test_util.h"
#include "kernels/kernels.h"

using namespace apiary::testing;
namespace k = apiary::kernels;

namespace {

struct Shape {
    int B, T, NH, KVH, HS;
    int R() const { return (NH + 2 * KVH) * HS; }
};

std::vector<double> ref_attention(const std::vector<double>& qkv, const Shape& s) {
    const int C = s.NH * s.HS, R = s.R(), G = s.NH / s.KVH;
    std::vector<double> out(size_t(s.B) * s.T * C, 0.0);
    const double scale = 1.0 / std::sqrt(double(s.HS));
    for (int b = 0; b < s.B; ++b)
        for (int h = 0; h < s.NH; ++h) {
            const int kvh = h / G;
            for (int i = 0; i < s.T; ++i) {
                std::vector<double> sc(i + 1);
                double mx = -1e300;
                for (int j = 0; j <= i; ++j) {
                    double d = 0;
                    for (int e = 0; e < s.HS; ++e)
                        d += qkv[(b * s.T + i) * R + h * s.HS + e] *
                             qkv[(b * s.T + j) * R + (s.NH + kvh) * s.HS + e];
                    sc[j] = d * scale;
                    mx = std::max(mx, sc[j]);
                }
                double den = 0;
                for (auto& v : sc) den += (v = std::exp(v - mx));
                for (int j = 0; j <= i; ++j)
                    for (int e = 0; e < s.HS; ++e)
                        out[(b * s.T + i) * C + h * s.HS + e] +=
                            sc[j] / den *
                            qkv[(b * s.T + j) * R + (s.NH + s.KVH + kvh) * s.HS + e];
            }
        }
    return out;
}

void check_forward(const Shape& s) {
    const auto qkv = random_vec(size_t(s.B) * s.T * s.R(), 30 + s.T);
    std::vector<float> out(size_t(s.B) * s.T * s.NH * s.HS), lse(size_t(s.B) * s.NH * s.T);
    k::attention_forward(out.data(), lse.data(), qkv.data(), s.B, s.T, s.NH, s.KVH, s.HS);
    EXPECT_LT(rel_error(out, ref_attention(to_f64(qkv), s)), 1e-5);
}

}  // namespace

TEST(Attention, ForwardMatchesNaiveSoftmax) { check_forward({2, 5, 2, 2, 3}); }
TEST(Attention, ForwardAcrossBlocksWithGqa) { check_forward({1, 131, 4, 2, 8}); }

TEST(Attention, BackwardMatchesFiniteDifferences) {
    // T = 67 crosses one block boundary; NH = 4 over KVH = 2 exercises the
    // accumulation of dK, dV over a group.
    const Shape s{1, 67, 4, 2, 5};
    const auto qkv = random_vec(size_t(s.B) * s.T * s.R(), 40);
    const size_t nout = size_t(s.B) * s.T * s.NH * s.HS;
    const auto dout = random_vec(nout, 41);
    std::vector<float> out(nout), lse(size_t(s.B) * s.NH * s.T), dqkv(qkv.size());
    k::attention_forward(out.data(), lse.data(), qkv.data(), s.B, s.T, s.NH, s.KVH, s.HS);
    k::attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), s.B, s.T,
                          s.NH, s.KVH, s.HS);
    const auto d64 = to_f64(dout);
    const auto g = finite_diff([&](const auto& x) { return dot(ref_attention(x, s), d64); },
                               to_f64(qkv));
    EXPECT_LT(rel_error(dqkv, g), 1e-4);
}

// ---- bf16 attention ----
// The reference runs in fp64 on the bf16-rounded q, k, v (exact in fp64), so
// what is left is the kernel's own rounding: P (forward), dO and dS
// (backward) and the output go through bf16, each off by up to bf16's unit
// roundoff 2^-8 = 3.9e-3; summed over a row's keys the errors partly cancel.
// Measured when written: 1.6-2.2e-3 forward, 2.5-2.9e-3 backward (max error
// over max |reference|); tolerances about 2.5x that. A mispacked pair or a
// wrong mask misses by orders of magnitude more.

namespace {

std::vector<float> round_bf16(const std::vector<float>& x) {
    std::vector<float> r(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
        r[i] = apiary::core::bf16_to_f32(apiary::core::f32_to_bf16(x[i]));
    }
    return r;
}

std::vector<uint16_t> to_bf16_bits(const std::vector<float>& x) {
    std::vector<uint16_t> h(x.size());
    for (size_t i = 0; i < x.size(); ++i) h[i] = apiary::core::f32_to_bf16(x[i]);
    return h;
}

std::vector<float> from_bf16_bits(const std::vector<uint16_t>& h) {
    std::vector<float> x(h.size());
    for (size_t i = 0; i < h.size(); ++i) x[i] = apiary::core::bf16_to_f32(h[i]);
    return x;
}

constexpr double kBf16FwdTol = 5e-3;
constexpr double kBf16BwdTol = 8e-3;

void check_forward_bf16(const Shape& s) {
    const auto qkv = round_bf16(random_vec(size_t(s.B) * s.T * s.R(), 60 + s.T));
    const auto qkv_h = to_bf16_bits(qkv);
    std::vector<uint16_t> out(size_t(s.B) * s.T * s.NH * s.HS);
    std::vector<float> lse(size_t(s.B) * s.NH * s.T), lse_ref(lse.size()),
        out_ref(out.size());
    k::attention_forward_bf16(out.data(), lse.data(), qkv_h.data(), s.B, s.T, s.NH, s.KVH, s.HS);
    const double err = rel_error(from_bf16_bits(out), ref_attention(to_f64(qkv), s));
    EXPECT_LT(err, kBf16FwdTol);
    // The log-sum-exp is fp32 statistics over bf16 scores: fp32 accuracy.
    k::attention_forward(out_ref.data(), lse_ref.data(), qkv.data(), s.B, s.T, s.NH, s.KVH, s.HS);
    EXPECT_LT(rel_error(lse, to_f64(lse_ref)), 1e-5);
}

}  // namespace

TEST(AttentionBf16, ForwardMatchesNaiveSoftmax) { check_forward_bf16({2, 5, 2, 2, 3}); }
TEST(AttentionBf16, ForwardAcrossBlocksWithGqa) { check_forward_bf16({1, 131, 4, 2, 8}); }
TEST(AttentionBf16, ForwardAtGpt2HeadSize) { check_forward_bf16({2, 192, 2, 2, 64}); }

TEST(AttentionBf16, BackwardMatchesFiniteDifferences) {
    // Odd T (67: one block boundary and a pair padding row), odd HS (pair
    // padding in the head dimension), NH = 4 over KVH = 2.
    const Shape s{1, 67, 4, 2, 5};
    const auto qkv = round_bf16(random_vec(size_t(s.B) * s.T * s.R(), 70));
    const auto qkv_h = to_bf16_bits(qkv);
    const size_t nout = size_t(s.B) * s.T * s.NH * s.HS;
    const auto dout = random_vec(nout, 71);
    std::vector<uint16_t> out(nout);
    std::vector<float> lse(size_t(s.B) * s.NH * s.T), dqkv(qkv.size(), 7.0f);
    k::attention_forward_bf16(out.data(), lse.data(), qkv_h.data(), s.B, s.T, s.NH, s.KVH, s.HS);
    k::attention_backward_bf16(dqkv.data(), dout.data(), qkv_h.data(), out.data(), lse.data(),
                               s.B, s.T, s.NH, s.KVH, s.HS);
    const auto d64 = to_f64(dout);
    const auto g = finite_diff([&](const auto& x) { return dot(ref_attention(x, s), d64); },
                               to_f64(qkv));
    EXPECT_LT(rel_error(dqkv, g), kBf16BwdTol);
}

// At the model's head size and two full blocks, against the fp32 kernel (itself
// checked against fp64 above) on the same bf16-rounded inputs.
TEST(AttentionBf16, BackwardMatchesFp32KernelAtGpt2HeadSize) {
    const Shape s{2, 128, 2, 2, 64};
    const auto qkv = round_bf16(random_vec(size_t(s.B) * s.T * s.R(), 72));
    const auto qkv_h = to_bf16_bits(qkv);
    const size_t nout = size_t(s.B) * s.T * s.NH * s.HS;
    const auto dout = random_vec(nout, 73);
    std::vector<uint16_t> out(nout);
    std::vector<float> lse(size_t(s.B) * s.NH * s.T), dqkv(qkv.size());
    k::attention_forward_bf16(out.data(), lse.data(), qkv_h.data(), s.B, s.T, s.NH, s.KVH, s.HS);
    k::attention_backward_bf16(dqkv.data(), dout.data(), qkv_h.data(), out.data(), lse.data(),
                               s.B, s.T, s.NH, s.KVH, s.HS);
    std::vector<float> out32(nout), lse32(lse.size()), dqkv32(qkv.size());
    k::attention_forward(out32.data(), lse32.data(), qkv.data(), s.B, s.T, s.NH, s.KVH, s.HS);
    k::attention_backward(dqkv32.data(), dout.data(), qkv.data(), out32.data(), lse32.data(), s.B,
                          s.T, s.NH, s.KVH, s.HS);
    EXPECT_LT(rel_error(dqkv, to_f64(dqkv32)), kBf16BwdTol);
}
