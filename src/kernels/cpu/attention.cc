// Causal attention with an online softmax (Milakov & Gimelshein 2018; the
// FlashAttention-2 blocking of Dao 2023), so memory is O(T) per head: scores
// exist only as one (64 x 64) block per thread. oneDNN's matmul overhead is
// large at these block sizes, so the block products use a small hand-written
// GEMM whose output tile stays in 16-lane vector registers (simd.h).


#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/omp_util.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/cpu/simd.h"
#include "kernels/kernels.h"

namespace apiary::kernels {

using namespace simd;  // NOLINT: the 16-lane vocabulary of these kernels

namespace {

using detail::fast_exp;
using detail::fast_exp_masked;

constexpr int64_t kBlock = 64;  // query and key block size (equal: see the mask logic)
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Register-blocked micro-kernel: an (R x 16 NV) tile of C stays in vector
// registers (R * NV <= 16 accumulators) while K streams through; the last
// 16-wide vector of a row is masked, so any N works.
template <int R, int NV>
void micro_kernel(int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, float* C,
                  int64_t ldc, Mask tail, bool accumulate) {
    Vf acc[R][NV];
    for (int r = 0; r < R; ++r) {
        for (int v = 0; v < NV; ++v) {
            const Mask m = v == NV - 1 ? tail : Mask(0xFFFF);
            acc[r][v] = accumulate ? maskz_loadu(m, C + r * ldc + 16 * v)
                                   : zero();
        }
    }
    for (int64_t k = 0; k < K; ++k) {
        Vf b[NV];
        for (int v = 0; v < NV; ++v) {
            const Mask m = v == NV - 1 ? tail : Mask(0xFFFF);
            b[v] = maskz_loadu(m, B + k * ldb + 16 * v);
        }
        for (int r = 0; r < R; ++r) {
            const Vf a = set1(A[r * lda + k]);
            for (int v = 0; v < NV; ++v) acc[r][v] = fmadd(a, b[v], acc[r][v]);
        }
    }
    for (int r = 0; r < R; ++r) {
        for (int v = 0; v < NV; ++v) {
            const Mask m = v == NV - 1 ? tail : Mask(0xFFFF);
            mask_storeu(C + r * ldc + 16 * v, m, acc[r][v]);
        }
    }
}

template <int R>
void micro_rows(int nv, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb,
                float* C, int64_t ldc, Mask tail, bool accumulate) {
    switch (nv) {
        case 1: return micro_kernel<R, 1>(K, A, lda, B, ldb, C, ldc, tail, accumulate);
        case 2: return micro_kernel<R, 2>(K, A, lda, B, ldb, C, ldc, tail, accumulate);
        case 3: return micro_kernel<R, 3>(K, A, lda, B, ldb, C, ldc, tail, accumulate);
        default: return micro_kernel<R, 4>(K, A, lda, B, ldb, C, ldc, tail, accumulate);
    }
}

// C (M, N) (+)= A (M, K) B (K, N), row-major with leading dimensions.
void small_gemm(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
                int64_t ldb, float* C, int64_t ldc, bool accumulate) {
    for (int64_t j0 = 0; j0 < N; j0 += 64) {
        const int64_t cols = std::min<int64_t>(64, N - j0);
        const int nv = int((cols + 15) / 16);
        const int rem = int(cols - 16 * (nv - 1));
        const Mask tail = Mask((1u << rem) - 1u);
        int64_t i = 0;
        for (; i + 4 <= M; i += 4) {
            micro_rows<4>(nv, K, A + i * lda, lda, B + j0, ldb, C + i * ldc + j0, ldc, tail,
                          accumulate);
        }
        const float* a = A + i * lda;
        float* c = C + i * ldc + j0;
        switch (M - i) {
            case 3: micro_rows<3>(nv, K, a, lda, B + j0, ldb, c, ldc, tail, accumulate); break;
            case 2: micro_rows<2>(nv, K, a, lda, B + j0, ldb, c, ldc, tail, accumulate); break;
            case 1: micro_rows<1>(nv, K, a, lda, B + j0, ldb, c, ldc, tail, accumulate); break;
            default: break;
        }
    }
}

// dst (cols, rows) = src (rows, cols)^T; src has leading dimension lds.
void transpose(float* dst, int64_t ldd, const float* src, int64_t lds, int64_t rows,
               int64_t cols) {
    for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) dst[c * ldd + r] = src[r * lds + c];
    }
}

struct Layout {
    int64_t T, NH, KVH, HS, R;  // R: row stride of qkv, (NH + 2 KVH) HS
    int64_t q(int64_t h) const { return h * HS; }
    int64_t k(int64_t kvh) const { return (NH + kvh) * HS; }
    int64_t v(int64_t kvh) const { return (NH + KVH + kvh) * HS; }
};

}  // namespace

void attention_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t NH,
                       int64_t KVH, int64_t HS) {
    const Layout L{T, NH, KVH, HS, (NH + 2 * KVH) * HS};
    const int64_t group = NH / KVH;
    const float scale = 1.0f / std::sqrt(float(HS));
    const int64_t C = NH * HS;
#pragma omp parallel
    {
        std::vector<float> kt(size_t(HS * T));     // K^T of one kv head (HS, T)
        std::vector<float> s(size_t(kBlock * kBlock));
        std::vector<float> o(size_t(kBlock * HS));
        float m[kBlock], l[kBlock];
#pragma omp for schedule(dynamic)
        for (int64_t task = 0; task < B * KVH; ++task) {
            const int64_t b = task / KVH, kvh = task % KVH;
            const float* base = qkv + b * T * L.R;
            transpose(kt.data(), T, base + L.k(kvh), L.R, T, HS);
            const float* vbase = base + L.v(kvh);
            for (int64_t g = 0; g < group; ++g) {
                const int64_t h = kvh * group + g;
                for (int64_t i0 = 0; i0 < T; i0 += kBlock) {
                    const int64_t qn = std::min(kBlock, T - i0);
                    const float* q = base + i0 * L.R + L.q(h);
                    std::fill(o.begin(), o.begin() + qn * HS, 0.0f);
                    std::fill(m, m + qn, kNegInf);
                    std::fill(l, l + qn, 0.0f);
                    for (int64_t j0 = 0; j0 <= i0; j0 += kBlock) {
                        const int64_t kn = std::min(kBlock, T - j0);
                        small_gemm(qn, kn, HS, q, L.R, kt.data() + j0, T, s.data(), kBlock,
                                   false);
                        for (int64_t r = 0; r < qn; ++r) {
                            float* sr = s.data() + r * kBlock;
                            const int64_t last = std::min(kn, i0 + r - j0 + 1);  // keys <= query
                            float mb = kNegInf;
                            for (int64_t c = 0; c < last; ++c) {
                                sr[c] *= scale;
                                mb = std::max(mb, sr[c]);
                            }
                            const float m_new = std::max(m[r], mb);
                            const float alpha = m[r] == kNegInf ? 0.0f : fast_exp(m[r] - m_new);
                            float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
                            for (int64_t c = 0; c < last; ++c) {
                                sr[c] = fast_exp(sr[c] - m_new);
                                sum += sr[c];
                            }
                            for (int64_t c = last; c < kn; ++c) sr[c] = 0.0f;
                            l[r] = l[r] * alpha + sum;
                            m[r] = m_new;
                            float* orow = o.data() + r * HS;
                            for (int64_t d = 0; d < HS; ++d) orow[d] *= alpha;
                        }
                        small_gemm(qn, HS, kn, s.data(), kBlock, vbase + j0 * L.R, L.R, o.data(),
                                   HS, true);
                    }
                    for (int64_t r = 0; r < qn; ++r) {
                        const float inv = 1.0f / l[r];
                        float* dst = out + (b * T + i0 + r) * C + h * HS;
                        const float* orow = o.data() + r * HS;
                        for (int64_t d = 0; d < HS; ++d) dst[d] = orow[d] * inv;
                        lse[(b * NH + h) * T + i0 + r] = m[r] + std::log(l[r]);
                    }
                }
            }
        }
    }
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, int64_t B, int64_t T, int64_t NH, int64_t KVH,
                        int64_t HS) {
    const Layout L{T, NH, KVH, HS, (NH + 2 * KVH) * HS};
    const int64_t group = NH / KVH;
    const float scale = 1.0f / std::sqrt(float(HS));
    const int64_t C = NH * HS;
#pragma omp parallel
    {
        std::vector<float> kt(size_t(HS * T)), vt(size_t(HS * T));
        std::vector<float> p(size_t(kBlock * kBlock)), dp(size_t(kBlock * kBlock));
        std::vector<float> pt(size_t(kBlock * kBlock));
        std::vector<float> dq(size_t(kBlock * HS));
        float D[kBlock];
#pragma omp for schedule(dynamic)
        for (int64_t task = 0; task < B * KVH; ++task) {
            const int64_t b = task / KVH, kvh = task % KVH;
            const float* base = qkv + b * T * L.R;
            float* dbase = dqkv + b * T * L.R;
            transpose(kt.data(), T, base + L.k(kvh), L.R, T, HS);
            transpose(vt.data(), T, base + L.v(kvh), L.R, T, HS);
            // This task alone owns the dK, dV columns of its kv head.
            for (int64_t t = 0; t < T; ++t) {
                std::fill_n(dbase + t * L.R + L.k(kvh), HS, 0.0f);
                std::fill_n(dbase + t * L.R + L.v(kvh), HS, 0.0f);
            }
            for (int64_t g = 0; g < group; ++g) {
                const int64_t h = kvh * group + g;
                for (int64_t i0 = 0; i0 < T; i0 += kBlock) {
                    const int64_t qn = std::min(kBlock, T - i0);
                    const float* q = base + i0 * L.R + L.q(h);
                    const float* dO = dout + (b * T + i0) * C + h * HS;
                    const float* O = out + (b * T + i0) * C + h * HS;
                    const float* lse_row = lse + (b * NH + h) * T + i0;
                    for (int64_t r = 0; r < qn; ++r) {
                        float acc = 0.0f;
                        for (int64_t d = 0; d < HS; ++d) acc += dO[r * C + d] * O[r * C + d];
                        D[r] = acc;
                    }
                    std::fill(dq.begin(), dq.begin() + qn * HS, 0.0f);
                    for (int64_t j0 = 0; j0 <= i0; j0 += kBlock) {
                        const int64_t kn = std::min(kBlock, T - j0);
                        small_gemm(qn, kn, HS, q, L.R, kt.data() + j0, T, p.data(), kBlock,
                                   false);
                        small_gemm(qn, kn, HS, dO, C, vt.data() + j0, T, dp.data(), kBlock,
                                   false);
                        for (int64_t r = 0; r < qn; ++r) {
                            float* pr = p.data() + r * kBlock;
                            float* dpr = dp.data() + r * kBlock;
                            const int64_t last = std::min(kn, i0 + r - j0 + 1);
                            const float lr = lse_row[r];
#pragma omp simd
                            for (int64_t c = 0; c < last; ++c) {
                                const float pc = fast_exp_masked(pr[c] * scale - lr);
                                pr[c] = pc;
                                dpr[c] = pc * (dpr[c] - D[r]) * scale;  // dS, scaled for Q K^T
                            }
                            for (int64_t c = last; c < kn; ++c) pr[c] = dpr[c] = 0.0f;
                        }
                        // dV_j += P^T dO_i
                        transpose(pt.data(), kBlock, p.data(), kBlock, qn, kn);
                        small_gemm(kn, HS, qn, pt.data(), kBlock, dO, C,
                                   dbase + j0 * L.R + L.v(kvh), L.R, true);
                        // dQ_i += dS K_j
                        small_gemm(qn, HS, kn, dp.data(), kBlock, base + j0 * L.R + L.k(kvh),
                                   L.R, dq.data(), HS, true);
                        // dK_j += dS^T Q_i
                        transpose(pt.data(), kBlock, dp.data(), kBlock, qn, kn);
                        small_gemm(kn, HS, qn, pt.data(), kBlock, q, L.R,
                                   dbase + j0 * L.R + L.k(kvh), L.R, true);
                    }
                    for (int64_t r = 0; r < qn; ++r) {
                        std::copy_n(dq.data() + r * HS, HS, dbase + (i0 + r) * L.R + L.q(h));
                    }
                }
            }
        }
    }
}

}  // namespace apiary::kernels
