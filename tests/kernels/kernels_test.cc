// Every kernel's forward against a plain fp64 reference and every backward
// against central finite differences of that reference, on small odd shapes.
// Tolerances: forward 2e-6 / 1e-5 relative (float rounding over sums of up to
// a few hundred terms); backward 1e-4 relative (float accumulation in the
// kernel; the fp64 finite differences themselves are good to ~1e-9).

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "core/tensor.h"
#include "kernel_test_util.h"
#include "kernels/kernels.h"

using namespace apiary;
using namespace apiary::testing;
namespace k = apiary::kernels;

namespace {

constexpr double kFwdTol = 1e-5;
constexpr double kBwdTol = 1e-4;

// y = x W^T + b in fp64.
std::vector<double> ref_linear(const std::vector<double>& x, const std::vector<double>& w,
                               const std::vector<double>& b, int N, int IN, int OUT) {
    std::vector<double> y(size_t(N) * OUT);
    for (int n = 0; n < N; ++n)
        for (int o = 0; o < OUT; ++o) {
            double s = b.empty() ? 0.0 : b[o];
            for (int i = 0; i < IN; ++i) s += x[n * IN + i] * w[o * IN + i];
            y[n * OUT + o] = s;
        }
    return y;
}

}  // namespace

TEST(Gemm, AllTransposesMatchReference) {
    const int M = 7, N = 13, K = 11;
    const auto a = random_vec(M * K, 1), b = random_vec(K * N, 2);
    for (int ta = 0; ta < 2; ++ta)
        for (int tb = 0; tb < 2; ++tb) {
            std::vector<float> c(M * N, 1.0f);
            // A stored (M,K) or (K,M); B stored (K,N) or (N,K).
            k::gemm(ta, tb, M, N, K, a.data(), ta ? M : K, b.data(), tb ? K : N, 1.0f, c.data(),
                    N);
            std::vector<double> ref(M * N);
            for (int i = 0; i < M; ++i)
                for (int j = 0; j < N; ++j) {
                    double s = 1.0;
                    for (int p = 0; p < K; ++p) {
                        const double av = ta ? a[p * M + i] : a[i * K + p];
                        const double bv = tb ? b[j * K + p] : b[p * N + j];
                        s += av * bv;
                    }
                    ref[i * N + j] = s;
                }
            EXPECT_LT(rel_error(c, ref), kFwdTol) << "ta=" << ta << " tb=" << tb;
        }
}

TEST(Linear, ForwardAndBackward) {
    const int N = 5, IN = 7, OUT = 3;
    const auto x = random_vec(N * IN, 3), w = random_vec(OUT * IN, 4), b = random_vec(OUT, 5);
    const auto dy = random_vec(N * OUT, 6);
    std::vector<float> y(N * OUT);
    k::linear_forward(y.data(), x.data(), w.data(), b.data(), N, IN, OUT);
    EXPECT_LT(rel_error(y, ref_linear(to_f64(x), to_f64(w), to_f64(b), N, IN, OUT)), kFwdTol);

    std::vector<float> dx(N * IN), dw(OUT * IN, 0.0f), db(OUT, 0.0f);
    k::linear_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), N, IN, OUT);
    const auto dy64 = to_f64(dy);
    auto loss_x = [&](const std::vector<double>& xv) {
        return dot(ref_linear(xv, to_f64(w), to_f64(b), N, IN, OUT), dy64);
    };
    auto loss_w = [&](const std::vector<double>& wv) {
        return dot(ref_linear(to_f64(x), wv, to_f64(b), N, IN, OUT), dy64);
    };
    auto loss_b = [&](const std::vector<double>& bv) {
        return dot(ref_linear(to_f64(x), to_f64(w), bv, N, IN, OUT), dy64);
    };
    EXPECT_LT(rel_error(dx, finite_diff(loss_x, to_f64(x))), kBwdTol);
    EXPECT_LT(rel_error(dw, finite_diff(loss_w, to_f64(w))), kBwdTol);
    EXPECT_LT(rel_error(db, finite_diff(loss_b, to_f64(b))), kBwdTol);
}

TEST(Embedding, ForwardAndBackwardWithRepeatedTokens) {
    const int B = 2, T = 3, C = 5, V = 4;
    const std::vector<int32_t> tok = {1, 3, 1, 0, 1, 2};
    const auto wte = random_vec(V * C, 7), wpe = random_vec(T * C, 8), d = random_vec(B * T * C, 9);
    std::vector<float> out(B * T * C);
    k::embedding_forward(out.data(), tok.data(), wte.data(), wpe.data(), B, T, C);
    std::vector<double> ref(B * T * C), dwte(V * C, 0.0), dwpe(T * C, 0.0);
    for (int i = 0; i < B * T; ++i)
        for (int c = 0; c < C; ++c) {
            ref[i * C + c] = double(wte[tok[i] * C + c]) + wpe[(i % T) * C + c];
            dwte[tok[i] * C + c] += d[i * C + c];
            dwpe[(i % T) * C + c] += d[i * C + c];
        }
    EXPECT_LT(rel_error(out, ref), kFwdTol);
    std::vector<float> gw(V * C, 0.0f), gp(T * C, 0.0f);
    k::embedding_backward(gw.data(), gp.data(), d.data(), tok.data(), B, T, C);
    EXPECT_LT(rel_error(gw, dwte), kFwdTol);
    EXPECT_LT(rel_error(gp, dwpe), kFwdTol);
}

namespace {

std::vector<double> ref_layernorm(const std::vector<double>& x, const std::vector<double>& w,
                                  const std::vector<double>& b, int N, int C, double eps) {
    std::vector<double> y(x.size());
    for (int n = 0; n < N; ++n) {
        double m = 0, v = 0;
        for (int c = 0; c < C; ++c) m += x[n * C + c];
        m /= C;
        for (int c = 0; c < C; ++c) v += (x[n * C + c] - m) * (x[n * C + c] - m);
        const double r = 1.0 / std::sqrt(v / C + eps);
        for (int c = 0; c < C; ++c) y[n * C + c] = (x[n * C + c] - m) * r * w[c] + b[c];
    }
    return y;
}

std::vector<double> ref_rmsnorm(const std::vector<double>& x, const std::vector<double>& w, int N,
                                int C, double eps) {
    std::vector<double> y(x.size());
    for (int n = 0; n < N; ++n) {
        double ss = 0;
        for (int c = 0; c < C; ++c) ss += x[n * C + c] * x[n * C + c];
        const double r = 1.0 / std::sqrt(ss / C + eps);
        for (int c = 0; c < C; ++c) y[n * C + c] = x[n * C + c] * r * w[c];
    }
    return y;
}

}  // namespace

TEST(LayerNorm, ForwardAndBackward) {
    const int N = 5, C = 19;
    const float eps = 1e-5f;
    const auto x = random_vec(N * C, 10), w = random_vec(C, 11), b = random_vec(C, 12),
               d = random_vec(N * C, 13);
    std::vector<float> y(N * C), mean(N), rstd(N);
    k::layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C,
                         eps);
    EXPECT_LT(rel_error(y, ref_layernorm(to_f64(x), to_f64(w), to_f64(b), N, C, eps)), kFwdTol);
    // dx accumulates: start from a known value and subtract it after.
    std::vector<float> dx(N * C, 0.5f), dw(C, 0.0f), db(C, 0.0f);
    k::layernorm_backward(dx.data(), dw.data(), db.data(), d.data(), x.data(), w.data(),
                          mean.data(), rstd.data(), N, C);
    for (auto& v : dx) v -= 0.5f;
    const auto d64 = to_f64(d);
    EXPECT_LT(rel_error(dx, finite_diff([&](const auto& xv) {
                  return dot(ref_layernorm(xv, to_f64(w), to_f64(b), N, C, eps), d64);
              }, to_f64(x))),
              kBwdTol);
    EXPECT_LT(rel_error(dw, finite_diff([&](const auto& wv) {
                  return dot(ref_layernorm(to_f64(x), wv, to_f64(b), N, C, eps), d64);
              }, to_f64(w))),
              kBwdTol);
    EXPECT_LT(rel_error(db, finite_diff([&](const auto& bv) {
                  return dot(ref_layernorm(to_f64(x), to_f64(w), bv, N, C, eps), d64);
              }, to_f64(b))),
              kBwdTol);
}

TEST(RmsNorm, ForwardAndBackward) {
    const int N = 6, C = 23;
    const float eps = 1e-5f;
    const auto x = random_vec(N * C, 14), w = random_vec(C, 15), d = random_vec(N * C, 16);
    std::vector<float> y(N * C), rstd(N);
    k::rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), N, C, eps);
    EXPECT_LT(rel_error(y, ref_rmsnorm(to_f64(x), to_f64(w), N, C, eps)), kFwdTol);
    std::vector<float> dx(N * C, 0.0f), dw(C, 0.0f);
    k::rmsnorm_backward(dx.data(), dw.data(), d.data(), x.data(), w.data(), rstd.data(), N, C);
    const auto d64 = to_f64(d);
    EXPECT_LT(rel_error(dx, finite_diff([&](const auto& xv) {
                  return dot(ref_rmsnorm(xv, to_f64(w), N, C, eps), d64);
              }, to_f64(x))),
              kBwdTol);
    EXPECT_LT(rel_error(dw, finite_diff([&](const auto& wv) {
                  return dot(ref_rmsnorm(to_f64(x), wv, N, C, eps), d64);
              }, to_f64(w))),
              kBwdTol);
}

TEST(Gelu, ForwardAndBackward) {
    const int n = 37;
    const auto x = random_vec(n, 17, 2.5f), d = random_vec(n, 18);
    auto ref = [](const std::vector<double>& xv) {
        std::vector<double> y(xv.size());
        for (size_t i = 0; i < xv.size(); ++i) {
            const double v = xv[i];
            y[i] = 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
        }
        return y;
    };
    std::vector<float> y(n), dx(n);
    k::gelu_forward(y.data(), x.data(), n);
    EXPECT_LT(rel_error(y, ref(to_f64(x))), kFwdTol);
    k::gelu_backward(dx.data(), x.data(), d.data(), n);
    const auto d64 = to_f64(d);
    EXPECT_LT(rel_error(dx, finite_diff([&](const auto& xv) { return dot(ref(xv), d64); },
                                        to_f64(x))),
              kBwdTol);
}

TEST(SwiGlu, ForwardAndBackward) {
    const int N = 3, F = 17;
    const auto h = random_vec(N * 2 * F, 19, 2.0f), d = random_vec(N * F, 20);
    auto ref = [&](const std::vector<double>& hv) {
        std::vector<double> y(size_t(N) * F);
        for (int n = 0; n < N; ++n)
            for (int j = 0; j < F; ++j) {
                const double a = hv[n * 2 * F + j], b = hv[n * 2 * F + F + j];
                y[n * F + j] = a / (1 + std::exp(-a)) * b;
            }
        return y;
    };
    std::vector<float> y(N * F), dh(N * 2 * F);
    k::swiglu_forward(y.data(), h.data(), N, F);
    EXPECT_LT(rel_error(y, ref(to_f64(h))), kFwdTol);
    k::swiglu_backward(dh.data(), d.data(), h.data(), N, F);
    const auto d64 = to_f64(d);
    EXPECT_LT(rel_error(dh, finite_diff([&](const auto& hv) { return dot(ref(hv), d64); },
                                        to_f64(h))),
              kBwdTol);
}

TEST(Rope, ForwardMatchesReferenceAndInverseUndoesIt) {
    const int B = 2, T = 9, heads = 3, HS = 6, stride = heads * HS + 4, offset = 2;
    const float theta = 10000.0f;
    std::vector<float> cs(T * HS / 2), sn(T * HS / 2);
    k::rope_tables(cs.data(), sn.data(), T, HS, theta);
    const auto x = random_vec(B * T * stride, 21);
    std::vector<float> y = x;
    k::rope_apply(y.data(), cs.data(), sn.data(), B, T, stride, offset, heads, HS, false);
    std::vector<double> ref(x.begin(), x.end());
    for (int bt = 0; bt < B * T; ++bt)
        for (int h = 0; h < heads; ++h)
            for (int i = 0; i < HS / 2; ++i) {
                const double freq = 1.0 / std::pow(double(theta), 2.0 * i / HS);
                const double ang = (bt % T) * double(float(freq));
                const size_t base = size_t(bt) * stride + offset + h * HS;
                const double a = x[base + i], b = x[base + i + HS / 2];
                ref[base + i] = a * std::cos(ang) - b * std::sin(ang);
                ref[base + i + HS / 2] = b * std::cos(ang) + a * std::sin(ang);
            }
    EXPECT_LT(rel_error(y, ref), kFwdTol);
    // The backward of a rotation is its inverse: applying it restores x.
    k::rope_apply(y.data(), cs.data(), sn.data(), B, T, stride, offset, heads, HS, true);
    EXPECT_LT(rel_error(y, to_f64(x)), kFwdTol);
}

namespace {

// Mean cross-entropy pieces in fp64: sum over valid rows of lse - logit[target].
double ref_ce(const std::vector<double>& h, const std::vector<double>& W,
              const std::vector<int32_t>& tgt, int N, int C, int V) {
    double loss = 0;
    for (int n = 0; n < N; ++n) {
        if (tgt[n] < 0) continue;
        std::vector<double> lg(V);
        double mx = -1e300;
        for (int v = 0; v < V; ++v) {
            double s = 0;
            for (int c = 0; c < C; ++c) s += h[n * C + c] * W[v * C + c];
            lg[v] = s;
            mx = std::max(mx, s);
        }
        double se = 0;
        for (int v = 0; v < V; ++v) se += std::exp(lg[v] - mx);
        loss += mx + std::log(se) - lg[tgt[n]];
    }
    return loss;
}

}  // namespace

TEST(LmHeadCrossEntropy, LossAndGradientsIgnoringMaskedRows) {
    const int N = 7, C = 5, V = 11;
    const auto h = random_vec(N * C, 22), W = random_vec(V * C, 23);
    const std::vector<int32_t> tgt = {3, 0, -1, 10, 7, 7, 1};
    std::vector<float> scratch(k::lm_head_scratch_floats(N, V));
    std::vector<float> dh(N * C), dW(V * C, 0.0f);
    int64_t valid = 0;
    const float scale = 1.0f / 6;
    const double loss = k::lm_head_cross_entropy(h.data(), W.data(), tgt.data(), N, C, V, scale,
                                                 dh.data(), dW.data(), &valid, scratch.data(),
                                                 int64_t(scratch.size()));
    EXPECT_EQ(valid, 6);
    const double ref = ref_ce(to_f64(h), to_f64(W), tgt, N, C, V);
    EXPECT_NEAR(loss, ref, 1e-5 * std::fabs(ref));
    auto gh = finite_diff([&](const auto& hv) { return ref_ce(hv, to_f64(W), tgt, N, C, V); },
                          to_f64(h));
    auto gW = finite_diff([&](const auto& wv) { return ref_ce(to_f64(h), wv, tgt, N, C, V); },
                          to_f64(W));
    for (auto& g : gh) g *= scale;
    for (auto& g : gW) g *= scale;
    EXPECT_LT(rel_error(dh, gh), kBwdTol);
    EXPECT_LT(rel_error(dW, gW), kBwdTol);
    // Masked row: no gradient flows into its hidden state.
    for (int c = 0; c < C; ++c) EXPECT_EQ(dh[2 * C + c], 0.0f);
}

TEST(LmHeadCrossEntropy, ChunkedLogSumExpMatchesFused) {
    const int N = 9, C = 4, V = 29;
    const auto h = random_vec(N * C, 24, 3.0f), W = random_vec(V * C, 25);
    std::vector<int32_t> tgt(N);
    for (int n = 0; n < N; ++n) tgt[n] = (n * 7) % V;
    std::vector<float> lse(N), tl(N);
    k::lm_head_logsumexp(lse.data(), tl.data(), h.data(), W.data(), tgt.data(), N, C, V, 6);
    double sum = 0;
    for (int n = 0; n < N; ++n) sum += double(lse[n]) - tl[n];
    const double ref = ref_ce(to_f64(h), to_f64(W), tgt, N, C, V);
    EXPECT_NEAR(sum, ref, 1e-5 * std::fabs(ref));
}

TEST(AdamW, MatchesReferenceFormula) {
    const int n = 21;
    auto p = random_vec(n, 26), g = random_vec(n, 27);
    std::vector<float> m(n, 0.0f), v(n, 0.0f);
    std::vector<double> rp(p.begin(), p.end()), rm(n, 0.0), rv(n, 0.0);
    const double lr = 1e-2, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1, gs = 0.5;
    for (int t = 1; t <= 3; ++t) {
        k::adamw_update(p.data(), g.data(), m.data(), v.data(), n, float(lr), float(b1),
                        float(b2), float(eps), float(wd), t, float(gs));
        for (int i = 0; i < n; ++i) {
            const double gi = g[i] * gs;
            rm[i] = b1 * rm[i] + (1 - b1) * gi;
            rv[i] = b2 * rv[i] + (1 - b2) * gi * gi;
            const double mh = rm[i] / (1 - std::pow(b1, t)), vh = rv[i] / (1 - std::pow(b2, t));
            rp[i] = rp[i] * (1 - lr * wd) - lr * mh / (std::sqrt(vh) + eps);
        }
    }
    EXPECT_LT(rel_error(p, rp), kFwdTol);
}

// The fused bf16 copy changes nothing in the fp32 update (bit for bit) and
// writes exactly what a separate to_bf16 of the result would. n crosses the
// kernel's 2048-element chunks and ends in a partial 16-lane vector.
TEST(AdamW, Bf16CopyIsTheCastOfTheSameUpdate) {
    const int n = 2 * 2048 + 37;
    auto p = random_vec(n, 29), g = random_vec(n, 30);
    auto p2 = p;
    std::vector<float> m(n, 0.0f), v(n, 0.0f), m2(n, 0.0f), v2(n, 0.0f);
    std::vector<uint16_t> copy(n, 0), cast(n);
    for (int t = 1; t <= 2; ++t) {
        k::adamw_update(p.data(), g.data(), m.data(), v.data(), n, 1e-2f, 0.9f, 0.95f, 1e-8f,
                        0.1f, t, 0.5f);
        k::adamw_update_bf16_copy(p2.data(), copy.data(), g.data(), m2.data(), v2.data(), n,
                                  1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, t, 0.5f);
    }
    EXPECT_EQ(std::memcmp(p.data(), p2.data(), n * sizeof(float)), 0);
    EXPECT_EQ(std::memcmp(m.data(), m2.data(), n * sizeof(float)), 0);
    EXPECT_EQ(std::memcmp(v.data(), v2.data(), n * sizeof(float)), 0);
    k::to_bf16(cast.data(), p.data(), n);
    EXPECT_EQ(copy, cast);
}

TEST(SumSquares, MatchesReference) {
    const int n = 10007;
    const auto x = random_vec(n, 28);
    double ref = 0;
    for (float v : x) ref += double(v) * v;
    EXPECT_NEAR(k::sum_squares(x.data(), n), ref, 1e-6 * ref);
}

namespace {
std::vector<uint16_t> bf16_of(const std::vector<float>& v) {
    std::vector<uint16_t> h(v.size());
    k::to_bf16(h.data(), v.data(), int64_t(v.size()));
    return h;
}
std::vector<double> f64_of(const std::vector<uint16_t>& h) {
    std::vector<double> d(h.size());
    for (size_t i = 0; i < h.size(); ++i) d[i] = apiary::core::bf16_to_f32(h[i]);
    return d;
}
}  // namespace

TEST(Bf16, ConversionRoundsToNearestEven) {
    const auto x = random_vec(37, 50);
    const auto h = bf16_of(x);
    for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(h[i], apiary::core::f32_to_bf16(x[i]));
}

// bf16 inputs are exact in fp64, so the only error left is fp32 accumulation.
TEST(Bf16, LinearForwardAndBackwardMatchReferenceOnBf16Inputs) {
    const int N = 9, IN = 21, OUT = 13;
    const auto xh = bf16_of(random_vec(N * IN, 51)), wh = bf16_of(random_vec(OUT * IN, 52));
    const auto b = random_vec(OUT, 53);
    const auto dyh = bf16_of(random_vec(N * OUT, 54));
    std::vector<float> y(N * OUT);
    k::linear_forward_bf16(y.data(), xh.data(), wh.data(), b.data(), N, IN, OUT);
    const auto x64 = f64_of(xh), w64 = f64_of(wh), dy64 = f64_of(dyh);
    EXPECT_LT(rel_error(y, ref_linear(x64, w64, to_f64(b), N, IN, OUT)), kFwdTol);
    // With a bf16 output: the same sums, rounded as to_bf16 rounds.
    std::vector<uint16_t> yh(N * OUT);
    k::linear_forward_bf16_out(yh.data(), xh.data(), wh.data(), b.data(), N, IN, OUT);
    EXPECT_EQ(yh, bf16_of(y));
    std::vector<float> dx(N * IN), dw(OUT * IN, 0.0f);
    k::linear_backward_bf16(dx.data(), dw.data(), dyh.data(), xh.data(), wh.data(), N, IN, OUT);
    std::vector<double> rdx(N * IN, 0.0), rdw(OUT * IN, 0.0);
    for (int n = 0; n < N; ++n)
        for (int o = 0; o < OUT; ++o)
            for (int i = 0; i < IN; ++i) {
                rdx[n * IN + i] += dy64[n * OUT + o] * w64[o * IN + i];
                rdw[o * IN + i] += dy64[n * OUT + o] * x64[n * IN + i];
            }
    EXPECT_LT(rel_error(dx, rdx), kFwdTol);
    EXPECT_LT(rel_error(dw, rdw), kFwdTol);
}

namespace {

// gemm_bf16 in one form (transposes, leading dimensions past the used
// columns, beta 0 and 1) against fp64 on the bf16 operands.
void check_gemm_bf16_form(bool ta, bool tb, float beta) {
    const int M = 7, N = 19, K = 33, pad = 3;
    const int a_rows = ta ? K : M, a_cols = (ta ? M : K) + pad;
    const int b_rows = tb ? N : K, b_cols = (tb ? K : N) + pad;
    const auto ah = bf16_of(random_vec(a_rows * a_cols, 57)), bh = bf16_of(random_vec(b_rows * b_cols, 58));
    const auto a64 = f64_of(ah), b64 = f64_of(bh);
    const int ldc = N + pad;
    std::vector<float> c = random_vec(M * ldc, 59);
    std::vector<double> ref(M * ldc);
    for (int m = 0; m < M; ++m)
        for (int n = 0; n < ldc; ++n) {
            double acc = n < N ? beta * double(c[m * ldc + n]) : double(c[m * ldc + n]);
            for (int kk = 0; n < N && kk < K; ++kk) {
                const double av = ta ? a64[kk * a_cols + m] : a64[m * a_cols + kk];
                const double bv = tb ? b64[n * b_cols + kk] : b64[kk * b_cols + n];
                acc += av * bv;
            }
            ref[m * ldc + n] = acc;
        }
    k::gemm_bf16(ta, tb, M, N, K, ah.data(), a_cols, bh.data(), b_cols, beta, c.data(), ldc);
    EXPECT_LT(rel_error(c, ref), kFwdTol) << "trans_a " << ta << " trans_b " << tb << " beta " << beta;
}

void check_gemm_bf16_forms() {
    for (bool ta : {false, true})
        for (bool tb : {false, true})
            for (float beta : {0.0f, 1.0f}) check_gemm_bf16_form(ta, tb, beta);
}

}  // namespace

// Where oneDNN has no bf16 matmul (AVX2 CPUs) every bf16 GEMM widens its
// operands to fp32: both paths are checked on any machine, and where both
// exist they agree to fp32 summation order.
TEST(Bf16, GemmInEveryFormMatchesReferenceNativeAndWidened) {
    if (k::gemm_bf16_is_native()) check_gemm_bf16_forms();
    k::force_gemm_bf16_widening(true);
    EXPECT_FALSE(k::gemm_bf16_is_native());
    check_gemm_bf16_forms();
    const int N = 9, IN = 21, OUT = 13;
    const auto xh = bf16_of(random_vec(N * IN, 51)), wh = bf16_of(random_vec(OUT * IN, 52));
    const auto b = random_vec(OUT, 53);
    std::vector<float> y_wide(N * OUT);
    std::vector<uint16_t> yh_wide(N * OUT);
    k::linear_forward_bf16(y_wide.data(), xh.data(), wh.data(), b.data(), N, IN, OUT);
    k::linear_forward_bf16_out(yh_wide.data(), xh.data(), wh.data(), b.data(), N, IN, OUT);
    k::force_gemm_bf16_widening(false);
    EXPECT_EQ(yh_wide, bf16_of(y_wide));
    EXPECT_LT(rel_error(y_wide, ref_linear(f64_of(xh), f64_of(wh), to_f64(b), N, IN, OUT)), kFwdTol);
    if (k::gemm_bf16_is_native()) {
        std::vector<float> y(N * OUT);
        k::linear_forward_bf16(y.data(), xh.data(), wh.data(), b.data(), N, IN, OUT);
        EXPECT_LT(rel_error(y_wide, to_f64(y)), 1e-6);
    }
}

namespace {

// The bf16 head against fp64 on the bf16 h and W (exact in fp64), with the
// gradient written analytically: (softmax - onehot) * scale. Tolerances: the
// loss comes from fp32 logits (1e-5); the gradients go through the
// bf16-rounded logit gradients (bf16's unit roundoff is 2^-8 = 3.9e-3):
// measured 2.4e-3 (dh) and 3.9e-4 (dW, which sums over 1000 rows) when
// written; tolerances 6e-3 and 2e-3.
void check_head_bf16(int N, int C, int V) {
    const auto hh = bf16_of(random_vec(N * C, 55, 2.0f)), Wh = bf16_of(random_vec(V * C, 56));
    const auto h64 = f64_of(hh), W64 = f64_of(Wh);
    std::vector<int32_t> tgt(N);
    for (int n = 0; n < N; ++n) tgt[n] = n % 11 == 3 ? -1 : (n * 7919) % V;
    std::vector<float> scratch(k::lm_head_scratch_floats(N, V));
    std::vector<uint16_t> scratch_h(k::lm_head_scratch_bf16(N, V));
    std::vector<float> dh(N * C, 5.0f), dW(V * C, 1.0f);
    int64_t valid = 0;
    const float scale = 1.0f / 1000;
    const double loss = k::lm_head_cross_entropy_bf16(
        hh.data(), Wh.data(), tgt.data(), N, C, V, scale, dh.data(), dW.data(), &valid,
        scratch.data(), int64_t(scratch.size()), scratch_h.data());
    int masked = 0;
    for (int32_t t : tgt) masked += t < 0;
    EXPECT_EQ(valid, N - masked);
    const double ref = ref_ce(h64, W64, tgt, N, C, V);
    EXPECT_NEAR(loss, ref, 1e-5 * std::fabs(ref));
    std::vector<double> rdh(N * C, 0.0), rdW(V * C, 0.0);
    for (int n = 0; n < N; ++n) {
        if (tgt[n] < 0) continue;
        std::vector<double> lg(V);
        double mx = -1e300, se = 0;
        for (int v = 0; v < V; ++v) {
            for (int c = 0; c < C; ++c) lg[v] += h64[n * C + c] * W64[v * C + c];
            mx = std::max(mx, lg[v]);
        }
        for (int v = 0; v < V; ++v) se += std::exp(lg[v] - mx);
        for (int v = 0; v < V; ++v) {
            const double g = (std::exp(lg[v] - mx) / se - (v == tgt[n])) * scale;
            for (int c = 0; c < C; ++c) {
                rdh[n * C + c] += g * W64[v * C + c];
                rdW[v * C + c] += g * h64[n * C + c];
            }
        }
    }
    EXPECT_LT(rel_error(dh, rdh), 6e-3);
    // dW accumulates onto its initial 1: compare what was added.
    for (auto& w : dW) w -= 1.0f;
    EXPECT_LT(rel_error(dW, rdW), 2e-3);
    // Masked rows: no gradient flows into their hidden states.
    for (int c = 0; c < C; ++c) EXPECT_EQ(dh[3 * C + c], 0.0f);
}

}  // namespace

// N = 1100 spans three 512-row blocks, a partial 16-row tile and two dW
// passes (1024 rows each); V = 37 ends in a partial 16-column tile.
TEST(Bf16, LmHeadCrossEntropyMatchesReference) { check_head_bf16(1100, 24, 37); }
// A vocabulary past the dW GEMM's 16384-row chunks.
TEST(Bf16, LmHeadCrossEntropyOverVocabularyChunks) { check_head_bf16(40, 8, 16384 + 21); }

// The kernels that write a bf16 matmul operand directly. GELU and the casts
// use the fp32 kernels' formulas and to_bf16's rounding: equal bit for bit to
// the fp32 kernel followed by to_bf16 (and the column sums equal to
// linear_bias_backward's, added in the same order). Shapes cross the 16-lane
// vectors and 64-column blocks.
TEST(Bf16, GeluAndCastsEqualFp32KernelThenCast) {
    const int N = 37, W = 100;
    const auto x = random_vec(N * W, 57, 2.0f), d = random_vec(N * W, 58);
    std::vector<float> y(N * W), dx(N * W), sums(W, 0.5f), sums_ref(W, 0.5f);
    std::vector<uint16_t> got(N * W);
    k::gelu_forward(y.data(), x.data(), N * W);
    k::gelu_forward_bf16(got.data(), x.data(), N * W);
    EXPECT_EQ(got, bf16_of(y));
    k::gelu_backward(dx.data(), x.data(), d.data(), N * W);
    k::gelu_backward_bf16(got.data(), sums.data(), x.data(), d.data(), N, W);
    k::linear_bias_backward(sums_ref.data(), dx.data(), N, W);
    EXPECT_EQ(got, bf16_of(dx));
    EXPECT_EQ(sums, sums_ref);
    k::to_bf16_column_sums(got.data(), sums.data(), d.data(), N, W);
    k::linear_bias_backward(sums_ref.data(), d.data(), N, W);
    EXPECT_EQ(got, bf16_of(d));
    EXPECT_EQ(sums, sums_ref);
}

// LayerNorm with a bf16 output: statistics against fp64 at fp32 accuracy,
// the output within bf16 rounding (unit roundoff 2^-8 = 3.9e-3; measured
// 2.8e-3 of the largest output when written).
TEST(Bf16, LayerNormForwardMatchesReference) {
    const int N = 5, C = 83;
    const float eps = 1e-5f;
    const auto x = random_vec(N * C, 59, 3.0f), w = random_vec(C, 60), b = random_vec(C, 61);
    std::vector<uint16_t> y(N * C);
    std::vector<float> mean(N), rstd(N), mean32(N), rstd32(N), y32(N * C);
    k::layernorm_forward_bf16(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N,
                              C, eps);
    const auto ref = ref_layernorm(to_f64(x), to_f64(w), to_f64(b), N, C, eps);
    std::vector<float> yf(N * C);
    for (int i = 0; i < N * C; ++i) yf[i] = apiary::core::bf16_to_f32(y[i]);
    EXPECT_LT(rel_error(yf, ref), 5e-3);
    k::layernorm_forward(y32.data(), mean32.data(), rstd32.data(), x.data(), w.data(), b.data(), N,
                         C, eps);
    EXPECT_LT(rel_error(mean, to_f64(mean32)), kFwdTol);
    EXPECT_LT(rel_error(rstd, to_f64(rstd32)), kFwdTol);
}

TEST(F16Emulation, RoundsToTheHalfGridAndOverflowsToInf) {
    std::vector<float> x = {1.0f + 1.0f / 4096, 70000.0f, -3.0f, 1e-8f};
    k::round_to_f16(x.data(), int64_t(x.size()));
    EXPECT_EQ(x[0], 1.0f);
    EXPECT_TRUE(std::isinf(x[1]));
    EXPECT_EQ(x[2], -3.0f);
    EXPECT_EQ(x[3], 0.0f);  // below the smallest fp16 subnormal
}
