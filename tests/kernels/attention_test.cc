// Attention against a naive fp64 softmax(QK^T/sqrt(HS)) V with a causal mask,
// on shapes that cross the 64-row block boundary and use grouped-query heads.

#include <gtest/gtest.h>

#include <cmath>

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
