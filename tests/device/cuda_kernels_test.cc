// Every CUDA kernel against the CPU kernel on odd shapes, forward and
// backward, fp32 and bf16. The CPU kernels are themselves checked against
// fp64 references and finite differences (tests/kernels/) to the tolerances
// named below; two kernels each that close to the truth are within twice
// that of each other, so twice is what is allowed here: a CUDA kernel passes
// only if it could pass the CPU's own tests. Outputs a kernel writes are
// poisoned with NaN first, so an element it fails to write fails. Without a
// GPU every test reports itself skipped.

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "../kernels/kernel_test_util.h"
#include "device/context.h"
#include "kernels/kernels.h"

namespace apiary::device {
namespace {

namespace k = apiary::kernels;
using apiary::testing::random_vec;

constexpr double kFwdTol = 2 * 1e-5;      // tests/kernels/kernels_test.cc kFwdTol
constexpr double kBwdTol = 2 * 1e-4;      // idem kBwdTol
constexpr double kBf16FwdTol = 2 * 5e-3;  // tests/kernels/attention_test.cc
constexpr double kBf16BwdTol = 2 * 8e-3;

double rel(const std::vector<float>& got, const std::vector<float>& want) {
    EXPECT_EQ(got.size(), want.size());
    double num = 0.0, den = 1e-30;
    for (size_t i = 0; i < got.size(); ++i) {
        if (!std::isfinite(got[i])) return std::numeric_limits<double>::infinity();
        num = std::max(num, std::fabs(double(got[i]) - double(want[i])));
        den = std::max(den, std::fabs(double(want[i])));
    }
    return num / den;
}

std::vector<float> nan_vec(size_t n) {
    return std::vector<float>(n, std::numeric_limits<float>::quiet_NaN());
}

std::vector<uint16_t> bf16_of(const std::vector<float>& v) {
    std::vector<uint16_t> out(v.size());
    k::to_bf16(out.data(), v.data(), int64_t(v.size()));
    return out;
}

class CudaVsCpu : public ::testing::Test {
  protected:
    void SetUp() override {
        const CudaProbe p = probe_cuda();
        if (p.count == 0) GTEST_SKIP() << "no GPU here: " << p.error;
        ctx_ = DeviceContext::open(DeviceKind::cuda, 0);
    }
    Ops& ops() { return ctx_->ops(); }
    template <typename T>
    T* up(const std::vector<T>& v) {
        bufs_.push_back(ctx_->arena().allocate(std::max<size_t>(1, v.size()) * sizeof(T),
                                               core::MemCategory::buffers));
        ops().to_device(bufs_.back().data(), v.data(), v.size() * sizeof(T));
        return static_cast<T*>(bufs_.back().data());
    }
    template <typename T>
    std::vector<T> down(const T* p, size_t n) {
        std::vector<T> v(n);
        ops().to_host(v.data(), p, n * sizeof(T));
        return v;
    }
    std::unique_ptr<DeviceContext> ctx_;
    std::vector<DeviceBuffer> bufs_;
};

TEST_F(CudaVsCpu, GemmEveryTransposeWithBeta) {
    const int M = 67, N = 45, K = 129;
    const auto a = random_vec(M * K, 1), b = random_vec(K * N, 2), c0 = random_vec(M * N, 3);
    for (int ta = 0; ta < 2; ++ta)
        for (int tb = 0; tb < 2; ++tb)
            for (float beta : {0.0f, 1.0f}) {
                std::vector<float> want = c0;
                k::gemm(ta, tb, M, N, K, a.data(), ta ? M : K, b.data(), tb ? K : N, beta,
                        want.data(), N);
                float* C = up(beta == 0.0f ? nan_vec(M * N) : c0);
                ops().gemm(ta, tb, M, N, K, up(a), ta ? M : K, up(b), tb ? K : N, beta, C, N);
                EXPECT_LT(rel(down(C, M * N), want), kFwdTol) << ta << tb << beta;
            }
}

TEST_F(CudaVsCpu, GemmBf16EveryTranspose) {
    const int M = 67, N = 45, K = 129;
    const auto a = bf16_of(random_vec(M * K, 4)), b = bf16_of(random_vec(K * N, 5));
    const auto c0 = random_vec(M * N, 6);
    for (int ta = 0; ta < 2; ++ta)
        for (int tb = 0; tb < 2; ++tb) {
            std::vector<float> want = c0;
            k::gemm_bf16(ta, tb, M, N, K, a.data(), ta ? M : K, b.data(), tb ? K : N, 1.0f,
                         want.data(), N);
            float* C = up(c0);
            ops().gemm_bf16(ta, tb, M, N, K, up(a), ta ? M : K, up(b), tb ? K : N, 1.0f, C, N);
            EXPECT_LT(rel(down(C, M * N), want), kBf16FwdTol) << ta << tb;
        }
}

TEST_F(CudaVsCpu, LinearForwardAndBackward) {
    const int N = 37, IN = 53, OUT = 29;
    const auto x = random_vec(N * IN, 7), w = random_vec(OUT * IN, 8), b = random_vec(OUT, 9),
               dy = random_vec(N * OUT, 10), dw0 = random_vec(OUT * IN, 11),
               db0 = random_vec(OUT, 12);
    std::vector<float> y(N * OUT), dx(N * IN), dw = dw0, db = db0;
    k::linear_forward(y.data(), x.data(), w.data(), b.data(), N, IN, OUT);
    k::linear_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), N, IN, OUT);
    float *Y = up(nan_vec(N * OUT)), *DX = up(nan_vec(N * IN)), *DW = up(dw0), *DB = up(db0);
    const float *X = up(x), *W = up(w);
    ops().linear_forward(Y, X, W, up(b), N, IN, OUT);
    ops().linear_backward(DX, DW, DB, up(dy), X, W, N, IN, OUT);
    EXPECT_LT(rel(down(Y, y.size()), y), kFwdTol);
    EXPECT_LT(rel(down(DX, dx.size()), dx), kBwdTol);
    EXPECT_LT(rel(down(DW, dw.size()), dw), kBwdTol);
    EXPECT_LT(rel(down(DB, db.size()), db), kBwdTol);
}

TEST_F(CudaVsCpu, LinearBf16ForwardAndBackward) {
    const int N = 37, IN = 53, OUT = 29;
    const auto x = bf16_of(random_vec(N * IN, 13)), w = bf16_of(random_vec(OUT * IN, 14)),
               dy = bf16_of(random_vec(N * OUT, 15));
    const auto b = random_vec(OUT, 16), dw0 = random_vec(OUT * IN, 17);
    std::vector<float> y(N * OUT), dx(N * IN), dw = dw0;
    k::linear_forward_bf16(y.data(), x.data(), w.data(), b.data(), N, IN, OUT);
    k::linear_backward_bf16(dx.data(), dw.data(), dy.data(), x.data(), w.data(), N, IN, OUT);
    float *Y = up(nan_vec(N * OUT)), *DX = up(nan_vec(N * IN)), *DW = up(dw0);
    const uint16_t *X = up(x), *W = up(w);
    ops().linear_forward_bf16(Y, X, W, up(b), N, IN, OUT);
    ops().linear_backward_bf16(DX, DW, up(dy), X, W, N, IN, OUT);
    EXPECT_LT(rel(down(Y, y.size()), y), kBf16FwdTol);
    EXPECT_LT(rel(down(DX, dx.size()), dx), kBf16BwdTol);
    EXPECT_LT(rel(down(DW, dw.size()), dw), kBf16BwdTol);
}

TEST_F(CudaVsCpu, EmbeddingWithRepeatedTokens) {
    const int B = 3, T = 11, C = 37, V = 7;
    std::vector<int32_t> tok(B * T);
    for (int i = 0; i < B * T; ++i) tok[i] = (i * 5 + 3) % V;  // repeats
    const auto wte = random_vec(V * C, 18), wpe = random_vec(T * C, 19),
               dout = random_vec(B * T * C, 20), dwte0 = random_vec(V * C, 21),
               dwpe0 = random_vec(T * C, 22);
    std::vector<float> out(B * T * C), dwte = dwte0, dwpe = dwpe0;
    k::embedding_forward(out.data(), tok.data(), wte.data(), wpe.data(), B, T, C);
    k::embedding_backward(dwte.data(), dwpe.data(), dout.data(), tok.data(), B, T, C);
    const int32_t* TOK = up(tok);
    float *OUT = up(nan_vec(out.size())), *DWTE = up(dwte0), *DWPE = up(dwpe0);
    ops().embedding_forward(OUT, TOK, up(wte), up(wpe), B, T, C);
    ops().embedding_backward(DWTE, DWPE, up(dout), TOK, B, T, C);
    EXPECT_LT(rel(down(OUT, out.size()), out), kFwdTol);
    EXPECT_LT(rel(down(DWTE, dwte.size()), dwte), kBwdTol);
    EXPECT_LT(rel(down(DWPE, dwpe.size()), dwpe), kBwdTol);
}

TEST_F(CudaVsCpu, LayerNormAndRmsNormForwardAndBackward) {
    const int N = 37, C = 775;
    const auto x = random_vec(N * C, 23), w = random_vec(C, 24), b = random_vec(C, 25),
               d = random_vec(N * C, 26), dx0 = random_vec(N * C, 27), dw0 = random_vec(C, 28);
    {
        std::vector<float> y(N * C), mean(N), rstd(N), dx = dx0, dw = dw0, db = dw0;
        k::layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C,
                             1e-5f);
        k::layernorm_backward(dx.data(), dw.data(), db.data(), d.data(), x.data(), w.data(),
                              mean.data(), rstd.data(), N, C);
        float *Y = up(nan_vec(y.size())), *M = up(nan_vec(N)), *R = up(nan_vec(N));
        float *DX = up(dx0), *DW = up(dw0), *DB = up(dw0);
        const float *X = up(x), *W = up(w);
        ops().layernorm_forward(Y, M, R, X, W, up(b), N, C, 1e-5f);
        ops().layernorm_backward(DX, DW, DB, up(d), X, W, M, R, N, C);
        EXPECT_LT(rel(down(Y, y.size()), y), kFwdTol);
        EXPECT_LT(rel(down(R, N), rstd), kFwdTol);
        EXPECT_LT(rel(down(DX, dx.size()), dx), kBwdTol);
        EXPECT_LT(rel(down(DW, C), dw), kBwdTol);
        EXPECT_LT(rel(down(DB, C), db), kBwdTol);
    }
    {
        std::vector<float> y(N * C), rstd(N), dx = dx0, dw = dw0;
        k::rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), N, C, 1e-6f);
        k::rmsnorm_backward(dx.data(), dw.data(), d.data(), x.data(), w.data(), rstd.data(), N, C);
        float *Y = up(nan_vec(y.size())), *R = up(nan_vec(N)), *DX = up(dx0), *DW = up(dw0);
        const float *X = up(x), *W = up(w);
        ops().rmsnorm_forward(Y, R, X, W, N, C, 1e-6f);
        ops().rmsnorm_backward(DX, DW, up(d), X, W, R, N, C);
        EXPECT_LT(rel(down(Y, y.size()), y), kFwdTol);
        EXPECT_LT(rel(down(DX, dx.size()), dx), kBwdTol);
        EXPECT_LT(rel(down(DW, C), dw), kBwdTol);
    }
}

TEST_F(CudaVsCpu, GeluAndSwiGluForwardAndBackward) {
    const int N = 37, F = 101;
    const auto x = random_vec(N * 2 * F, 29, 2.0f), d = random_vec(N * 2 * F, 30);
    std::vector<float> g(N * F), dg(N * F), s(N * F), ds(N * 2 * F);
    k::gelu_forward(g.data(), x.data(), N * F);
    k::gelu_backward(dg.data(), x.data(), d.data(), N * F);
    k::swiglu_forward(s.data(), x.data(), N, F);
    k::swiglu_backward(ds.data(), d.data(), x.data(), N, F);
    const float *X = up(x), *D = up(d);
    float *G = up(nan_vec(g.size())), *DG = up(nan_vec(dg.size())), *S = up(nan_vec(s.size())),
          *DS = up(nan_vec(ds.size()));
    ops().gelu_forward(G, X, N * F);
    ops().gelu_backward(DG, X, D, N * F);
    ops().swiglu_forward(S, X, N, F);
    ops().swiglu_backward(DS, D, X, N, F);
    EXPECT_LT(rel(down(G, g.size()), g), kFwdTol);
    EXPECT_LT(rel(down(DG, dg.size()), dg), kBwdTol);
    EXPECT_LT(rel(down(S, s.size()), s), kFwdTol);
    EXPECT_LT(rel(down(DS, ds.size()), ds), kBwdTol);
}

TEST_F(CudaVsCpu, RopeForwardAndInverse) {
    const int B = 2, T = 13, heads = 3, HS = 18, stride = 5 * HS + 3, offset = HS + 1;
    std::vector<float> cs(T * HS / 2), sn(T * HS / 2);
    k::rope_tables(cs.data(), sn.data(), T, HS, 10000.0f);
    const auto x0 = random_vec(B * T * stride, 31);
    for (bool inverse : {false, true}) {
        std::vector<float> x = x0;
        k::rope_apply(x.data(), cs.data(), sn.data(), B, T, stride, offset, heads, HS, inverse);
        float* X = up(x0);
        ops().rope_apply(X, up(cs), up(sn), B, T, stride, offset, heads, HS, inverse);
        EXPECT_LT(rel(down(X, x.size()), x), kFwdTol) << inverse;
    }
}

void check_attention(CudaVsCpu& t, Ops& ops, int B, int T, int NH, int KVH, int HS,
                     const std::function<float*(const std::vector<float>&)>& up,
                     const std::function<std::vector<float>(const float*, size_t)>& down,
                     const std::function<float*(size_t)>& scratch) {
    (void)t;
    const int W = (NH + 2 * KVH) * HS;
    const auto qkv = random_vec(size_t(B) * T * W, 32),
               dout = random_vec(size_t(B) * T * NH * HS, 33);
    std::vector<float> out(size_t(B) * T * NH * HS), lse(size_t(B) * NH * T), dqkv(qkv.size());
    k::attention_forward(out.data(), lse.data(), qkv.data(), B, T, NH, KVH, HS);
    k::attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), B, T, NH,
                          KVH, HS);
    const float* QKV = up(qkv);
    float *OUT = up(nan_vec(out.size())), *LSE = up(nan_vec(lse.size())),
          *DQKV = up(nan_vec(dqkv.size()));
    ops.attention_forward(OUT, LSE, QKV, B, T, NH, KVH, HS);
    ops.attention_backward(DQKV, up(dout), QKV, OUT, LSE, B, T, NH, KVH, HS,
                           scratch(size_t(ops.attention_scratch_floats(B, T, NH))));
    EXPECT_LT(rel(down(OUT, out.size()), out), kFwdTol) << T << " " << HS;
    EXPECT_LT(rel(down(LSE, lse.size()), lse), kFwdTol);
    EXPECT_LT(rel(down(DQKV, dqkv.size()), dqkv), kBwdTol) << T << " " << HS;
}

TEST_F(CudaVsCpu, AttentionForwardAndBackwardGroupedQueryOddShapes) {
    auto upf = [this](const std::vector<float>& v) { return up(v); };
    auto downf = [this](const float* p, size_t n) { return down(p, n); };
    auto scratch = [this](size_t n) { return up(std::vector<float>(std::max<size_t>(n, 1))); };
    check_attention(*this, ops(), 2, 67, 6, 2, 40, upf, downf, scratch);   // GQA, HS not /32
    check_attention(*this, ops(), 1, 131, 4, 4, 64, upf, downf, scratch);  // MHA, T past tiles
    check_attention(*this, ops(), 1, 33, 2, 1, 128, upf, downf, scratch);  // the largest HS
}

TEST_F(CudaVsCpu, LmHeadCrossEntropyLossAndGradients) {
    const int N = 601, C = 40, V = 301;  // > one 512-row block
    const auto h = random_vec(N * C, 34), W = random_vec(V * C, 35, 0.3f),
               dW0 = random_vec(V * C, 36);
    std::vector<int32_t> targets(N);
    for (int i = 0; i < N; ++i) targets[i] = (i % 9 == 4) ? -1 : (i * 37) % V;
    std::vector<float> dh(N * C), dW = dW0, scratch(size_t(k::lm_head_scratch_floats(N, V)));
    int64_t valid = 0, valid_gpu = 0;
    const double loss =
        k::lm_head_cross_entropy(h.data(), W.data(), targets.data(), N, C, V, 0.25f, dh.data(),
                                 dW.data(), &valid, scratch.data(), int64_t(scratch.size()));
    const int64_t sf = ops().lm_head_scratch_floats(N, V);
    float *DH = up(nan_vec(dh.size())), *DW = up(dW0), *S = up(std::vector<float>(size_t(sf)));
    const double loss_gpu = ops().lm_head_cross_entropy(up(h), up(W), up(targets), N, C, V, 0.25f,
                                                        DH, DW, &valid_gpu, S, sf);
    EXPECT_EQ(valid_gpu, valid);
    EXPECT_NEAR(loss_gpu, loss, 2e-5 * std::fabs(loss));
    EXPECT_LT(rel(down(DH, dh.size()), dh), kBwdTol);
    EXPECT_LT(rel(down(DW, dW.size()), dW), kBwdTol);
}

TEST_F(CudaVsCpu, AdamWAndItsBf16Copy) {
    const int n = 10007;
    const auto p0 = random_vec(n, 37), g = random_vec(n, 38), m0 = random_vec(n, 39, 0.1f);
    auto v0 = random_vec(n, 40, 0.1f);
    for (auto& v : v0) v = v * v;
    std::vector<float> p = p0, m = m0, v = v0;
    std::vector<uint16_t> p16(n);
    k::adamw_update_bf16_copy(p.data(), p16.data(), g.data(), m.data(), v.data(), n, 3e-4f, 0.9f,
                              0.95f, 1e-8f, 0.1f, 7, 0.5f);
    float *P = up(p0), *M = up(m0), *Vv = up(v0);
    uint16_t* P16 = up(std::vector<uint16_t>(n, 0xFFFF));
    ops().adamw_update_bf16_copy(P, P16, up(g), M, Vv, n, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 7, 0.5f);
    EXPECT_LT(rel(down(P, n), p), kFwdTol);
    EXPECT_LT(rel(down(M, n), m), kFwdTol);
    EXPECT_LT(rel(down(Vv, n), v), kFwdTol);
    const auto got16 = down(P16, n);
    int64_t off_by_more_than_one_ulp = 0;
    for (int i = 0; i < n; ++i)
        off_by_more_than_one_ulp += std::abs(int(got16[i]) - int(p16[i])) > 1;
    EXPECT_EQ(off_by_more_than_one_ulp, 0);
}

TEST_F(CudaVsCpu, CastsLossScalingAndNorms) {
    const int n = 4099;
    auto x = random_vec(n, 41, 300.0f);
    x[5] = 70000.0f;  // beyond fp16: inf on both
    std::vector<uint16_t> b16(n);
    std::vector<float> f16(n);
    k::to_bf16(b16.data(), x.data(), n);
    k::copy_round_to_f16(f16.data(), x.data(), n);
    const float* X = up(x);
    uint16_t* B16 = up(std::vector<uint16_t>(n, 0xFFFF));
    float* F16 = up(nan_vec(n));
    ops().to_bf16(B16, X, n);
    ops().copy_round_to_f16(F16, X, n);
    EXPECT_EQ(down(B16, n), b16);
    const auto gf16 = down(F16, n);
    EXPECT_TRUE(std::isinf(gf16[5]));
    int64_t differ = 0;
    for (int i = 0; i < n; ++i) differ += !(gf16[i] == f16[i]);
    EXPECT_EQ(differ, 0);
    // Loss scaling: unscale by 1/1024 and accumulate.
    std::vector<float> y = random_vec(n, 42), s = random_vec(n, 43);
    float *Y = up(y), *S = up(s);
    k::scale_inplace(s.data(), n, 1.0f / 1024);
    k::add_inplace(y.data(), s.data(), n);
    ops().scale_inplace(S, n, 1.0f / 1024);
    ops().add_inplace(Y, S, n);
    EXPECT_EQ(down(Y, n), y);
    EXPECT_NEAR(ops().sum_squares(Y, n), k::sum_squares(y.data(), n),
                1e-6 * k::sum_squares(y.data(), n));
}

}  // namespace
}  // namespace apiary::device
