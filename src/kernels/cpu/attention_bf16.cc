// Causal attention in bf16: the same blockwise online softmax as attention.cc
// (FlashAttention-2 blocking), with every block product on bf16 pairs
// (vdpbf16ps on AVX512_BF16; simd.h's generic vectors on other CPUs).
// vdpbf16ps multiplies pairs of bf16 values and adds both products into one
// fp32 lane, so each instruction does twice the multiply-adds of an fp32 FMA;
// softmax statistics, the output before its final rounding and every
// gradient accumulate in fp32. oneDNN's matmul overhead is far too large for
// (64 x 64) blocks, hence the hand-written register-blocked kernel.
//
// vdpbf16ps wants the reduction dimension in adjacent pairs. A left operand
// stored row-major with the reduction contiguous already has them (one
// 32-bit broadcast per row); the right operand is packed once into "pair
// rows": element [k/2][n] holds (B[k][n], B[k+1][n]) as one 32-bit word. Odd
// reduction lengths are padded with a zero (in both operands, so no pad
// ever multiplies a value it was not meant to).
//
// The backward computes dK and dV transposed, (HS, T) per kv head, so that
// P and dS only ever need pair-row packing (two rows interleaved), never a
// transpose per block; one transpose per kv head writes them out.

// GCC 12 warns inside its own AVX-512 intrinsics (a known false positive on
// the unused upper half of a mask register), as in matmul_bf16.cc.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/vec_math.h"
#include "kernels/cpu/simd.h"
#include "kernels/kernels.h"

namespace apiary::kernels {

using namespace simd;  // NOLINT: the 16-lane vocabulary of these kernels

namespace {

constexpr int64_t kBlock = 64;  // query and key block size (equal: see the mask logic)

int64_t even(int64_t n) { return (n + 1) & ~int64_t(1); }

// Per-thread buffers kept across calls (OpenMP keeps its threads): allocated
// per call they went back to the OS when freed and were faulted in again on
// every call, a fifth of the backward's time. Contents are undefined on
// entry. Slot tells apart the buffers of one type that live at once.
template <typename T, int Slot>
T* scratch(int64_t n) {
    thread_local std::vector<T> buf;
    if (int64_t(buf.size()) < n) buf.resize(size_t(n));
    return buf.data();
}

uint32_t pair_of(uint16_t lo, uint16_t hi) { return uint32_t(lo) | uint32_t(hi) << 16; }

// The left operand of a product, addressed by pairs: the pair (A[r][2k],
// A[r][2k+1]) is the 32-bit word at base + r * row + k * pair (strides in
// bf16 elements). Row-major A with leading dimension ld is {ld, 2}; A given
// as pair rows of its transpose (word [k][r] = (A^T[2k][r], A^T[2k+1][r]),
// ld words per pair row) is {2, 2 ld}: so P^T and dS^T are read from the
// pair rows that P and dS are packed into anyway, with no transpose.
struct Pairs {
    const uint16_t* base;
    int64_t row, pair;
    Pairs rows_from(int64_t r) const { return {base + r * row, row, pair}; }
};

Pairs row_major(const uint16_t* a, int64_t ld) { return {a, ld, 2}; }
Pairs transposed_pair_rows(const uint32_t* a, int64_t ld) {
    return {reinterpret_cast<const uint16_t*>(a), 2, 2 * ld};
}

// An (R x 16 NV) fp32 tile of C in registers while K2 pairs stream through.
// row_scale (accumulating only) multiplies row r of the loaded C first: the
// online softmax's rescale of the output, folded into the load.
template <int R, int NV, bool kTail>
void dot_tile(int64_t K2, Pairs A, const uint32_t* B, int64_t ldb, float* C, int64_t ldc,
              Mask tail, bool accumulate, const float* row_scale) {
    // Only a partial last vector is accessed masked: masked loads and
    // stores are 2x slower than plain ones on this machine (measured).
    auto load_c = [&](const float* p, int v) {
        return kTail && v == NV - 1 ? maskz_loadu(tail, p) : loadu(p);
    };
    Vf acc[R][NV];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
        const Vf scale = set1(row_scale ? row_scale[r] : 1.0f);
#pragma GCC unroll 16
        for (int v = 0; v < NV; ++v) {
            acc[r][v] = accumulate ? mul(load_c(C + r * ldc + 16 * v, v), scale)
                                   : zero();
        }
    }
    for (int64_t k = 0; k < K2; ++k) {
        Vi b[NV];
#pragma GCC unroll 16
        for (int v = 0; v < NV; ++v) {
            const uint32_t* p = B + k * ldb + 16 * v;
            b[v] = kTail && v == NV - 1 ? maskz_loadu_i(tail, p) : loadu_i(p);
        }
        const uint16_t* ak = A.base + k * A.pair;
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
            uint32_t a2;
            std::memcpy(&a2, ak + r * A.row, 4);
            const Vi a = set1_i(a2);
#pragma GCC unroll 16
            for (int v = 0; v < NV; ++v) {
                acc[r][v] = dot_bf16_pairs(acc[r][v], a, b[v]);
            }
        }
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
        for (int v = 0; v < NV; ++v) {
            float* p = C + r * ldc + 16 * v;
            if (kTail && v == NV - 1) {
                mask_storeu(p, tail, acc[r][v]);
            } else {
                storeu(p, acc[r][v]);
            }
        }
    }
}

template <int R, bool kTail>
void dot_rows(int nv, int64_t K2, Pairs A, const uint32_t* B, int64_t ldb, float* C, int64_t ldc,
              Mask tail, bool accumulate, const float* row_scale) {
    switch (nv) {
        case 1:
            return dot_tile<R, 1, kTail>(K2, A, B, ldb, C, ldc, tail, accumulate, row_scale);
        case 2:
            return dot_tile<R, 2, kTail>(K2, A, B, ldb, C, ldc, tail, accumulate, row_scale);
        case 3:
            return dot_tile<R, 3, kTail>(K2, A, B, ldb, C, ldc, tail, accumulate, row_scale);
        default:
            return dot_tile<R, 4, kTail>(K2, A, B, ldb, C, ldc, tail, accumulate, row_scale);
    }
}

template <int R>
void dot_rows(int nv, int64_t K2, Pairs A, const uint32_t* B, int64_t ldb, float* C, int64_t ldc,
              Mask tail, bool accumulate, const float* row_scale) {
    if (tail == 0xFFFF) {
        dot_rows<R, false>(nv, K2, A, B, ldb, C, ldc, tail, accumulate, row_scale);
    } else {
        dot_rows<R, true>(nv, K2, A, B, ldb, C, ldc, tail, accumulate, row_scale);
    }
}

// C (M, N) fp32 (+)= A (M, 2 K2) * B (2 K2, N), B given as K2 pair rows of
// N words. row_scale (M) or null: see dot_tile.
void dot(int64_t M, int64_t N, int64_t K2, Pairs A, const uint32_t* B, int64_t ldb, float* C,
         int64_t ldc, bool accumulate, const float* row_scale = nullptr) {
    for (int64_t j0 = 0; j0 < N; j0 += 64) {
        const int64_t cols = std::min<int64_t>(64, N - j0);
        const int nv = int((cols + 15) / 16);
        const int rem = int(cols - 16 * (nv - 1));
        const Mask tail = Mask((1u << rem) - 1u);
        int64_t i = 0;
        for (; i + 4 <= M; i += 4) {
            dot_rows<4>(nv, K2, A.rows_from(i), B + j0, ldb, C + i * ldc + j0, ldc, tail,
                        accumulate, row_scale ? row_scale + i : nullptr);
        }
        const Pairs a = A.rows_from(i);
        float* c = C + i * ldc + j0;
        const float* rs = row_scale ? row_scale + i : nullptr;
        switch (M - i) {
            case 3:
                dot_rows<3>(nv, K2, a, B + j0, ldb, c, ldc, tail, accumulate, rs);
                break;
            case 2:
                dot_rows<2>(nv, K2, a, B + j0, ldb, c, ldc, tail, accumulate, rs);
                break;
            case 1:
                dot_rows<1>(nv, K2, a, B + j0, ldb, c, ldc, tail, accumulate, rs);
                break;
            default:
                break;
        }
    }
}

// dst (even(cols) / 2, rows) pair rows of src^T: dst[c/2][r] = (src[r][c],
// src[r][c+1]), src (rows, cols) with leading dimension lds; an odd last
// column pairs with zero. Q K^T and dO V^T take K and V this way.
void pack_columns(uint32_t* dst, const uint16_t* src, int64_t lds, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; ++r) {
        const uint16_t* s = src + r * lds;
        for (int64_t c = 0; c + 1 < cols; c += 2) dst[(c / 2) * rows + r] = pair_of(s[c], s[c + 1]);
        if (cols % 2) dst[(cols / 2) * rows + r] = pair_of(s[cols - 1], 0);
    }
}

// dst (even(rows) / 2, cols) pair rows of src: dst[r/2][c] = (src[r][c],
// src[r+1][c]); an odd last row pairs with zero. P V, dS K, P^T dO and
// dS^T Q take V, K, dO and Q this way.
void pack_rows(uint32_t* dst, const uint16_t* src, int64_t lds, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r + 1 < rows; r += 2) {
        const uint16_t* s0 = src + r * lds;
        const uint16_t* s1 = s0 + lds;
        uint32_t* d = dst + (r / 2) * cols;
        for (int64_t c = 0; c < cols; ++c) d[c] = uint32_t(s0[c]) | uint32_t(s1[c]) << 16;
    }
    if (rows % 2) {
        const uint16_t* s0 = src + (rows - 1) * lds;
        uint32_t* d = dst + (rows / 2) * cols;
        for (int64_t c = 0; c < cols; ++c) d[c] = s0[c];
    }
}

// dst (n) bf16 = src (n) * factor, rounded to nearest even.
void to_bf16_row(uint16_t* dst, const float* src, int64_t n, float factor) {
    for (int64_t i = 0; i < n; i += 16) {
        const Mask m = first_lanes(n - i);
        const Vf x = mul(maskz_loadu(m, src + i), set1(factor));
        mask_store_bf16(dst + i, m, x);
    }
}

// sum of x (n) * y (n) with y bf16, in fp32.
float dot_row(const float* x, const uint16_t* y, int64_t n) {
    Vf acc = zero();
    for (int64_t i = 0; i < n; i += 16) {
        const Mask m = first_lanes(n - i);
        acc = fmadd(maskz_loadu(m, x + i), maskz_load_bf16(m, y + i), acc);
    }
    return reduce_add(acc);
}

struct Layout {
    int64_t T, NH, KVH, HS, R;  // R: row stride of qkv, (NH + 2 KVH) HS
    int64_t q(int64_t h) const { return h * HS; }
    int64_t k(int64_t kvh) const { return (NH + kvh) * HS; }
    int64_t v(int64_t kvh) const { return (NH + KVH + kvh) * HS; }
};

// The query block (qn, HS) as a row-major left operand: read in place when
// HS is even, else copied into qb (qn, HS + 1) with a zero pad column.
Pairs query_block(const uint16_t* q, int64_t ld, int64_t qn, int64_t HS, uint16_t* qb) {
    if (HS % 2 == 0) return row_major(q, ld);
    for (int64_t r = 0; r < qn; ++r) {
        std::copy_n(q + r * ld, HS, qb + r * (HS + 1));
        qb[r * (HS + 1) + HS] = 0;
    }
    return row_major(qb, HS + 1);
}

// Row r of a query block against key block j0: scores s (kn, fp32), keys
// after the query masked. Online-softmax update of (m, l); the
// probabilities go to p (kBlock bf16, zero past the last key so the pair
// padding is zero too); returns the factor the old output is rescaled by.
float softmax_row(const float* s, uint16_t* p, int64_t last, float scale, float* m, float* l) {
    constexpr float kNegInf = -std::numeric_limits<float>::infinity();
    Vf x[kBlock / 16];
    Vf mx = set1(kNegInf);
    for (int v = 0; v < kBlock / 16; ++v) {
        const Mask live = first_lanes(last - 16 * v);
        x[v] = mask_mul(set1(kNegInf), live,
                                  maskz_loadu(live, s + 16 * v), set1(scale));
        mx = max(mx, x[v]);
    }
    const float m_new = std::max(*m, reduce_max(mx));
    const float alpha = *m == kNegInf ? 0.0f : detail::fast_exp(*m - m_new);
    Vf sum = zero();
    for (int v = 0; v < kBlock / 16; ++v) {
        const Mask live = first_lanes(last - 16 * v);
        const Vf e =
            maskz_mov(live, simd::exp(sub(x[v], set1(m_new))));
        sum = add(sum, e);
        store_bf16(p + 16 * v, e);
    }
    *l = *l * alpha + reduce_add(sum);
    *m = m_new;
    return alpha;
}

}  // namespace

void attention_forward_bf16(uint16_t* out, float* lse, const uint16_t* qkv, int64_t B, int64_t T,
                            int64_t NH, int64_t KVH, int64_t HS) {
    const Layout L{T, NH, KVH, HS, (NH + 2 * KVH) * HS};
    const int64_t group = NH / KVH, HSp = even(HS), C = NH * HS;
    const float scale = 1.0f / std::sqrt(float(HS));
#pragma omp parallel
    {
        uint32_t* kp = scratch<uint32_t, 0>(HSp / 2 * T);       // K^T pair rows (HS/2, T)
        uint32_t* vp = scratch<uint32_t, 1>(even(T) / 2 * HS);  // V pair rows (T/2, HS)
        uint16_t* qb = scratch<uint16_t, 0>(kBlock * HSp);      // query block, odd HS only
        float* s = scratch<float, 0>(kBlock * kBlock);
        uint16_t* p = scratch<uint16_t, 1>(kBlock * kBlock);
        float* o = scratch<float, 1>(kBlock * HS);
        float m[kBlock], l[kBlock], alpha[kBlock];
#pragma omp for schedule(dynamic)
        for (int64_t task = 0; task < B * KVH; ++task) {
            const int64_t b = task / KVH, kvh = task % KVH;
            const uint16_t* base = qkv + b * T * L.R;
            pack_columns(kp, base + L.k(kvh), L.R, T, HS);
            pack_rows(vp, base + L.v(kvh), L.R, T, HS);
            for (int64_t g = 0; g < group; ++g) {
                const int64_t h = kvh * group + g;
                for (int64_t i0 = 0; i0 < T; i0 += kBlock) {
                    const int64_t qn = std::min(kBlock, T - i0);
                    const Pairs q = query_block(base + i0 * L.R + L.q(h), L.R, qn, HS, qb);
                    std::fill(m, m + qn, -std::numeric_limits<float>::infinity());
                    std::fill(l, l + qn, 0.0f);
                    for (int64_t j0 = 0; j0 <= i0; j0 += kBlock) {
                        const int64_t kn = std::min(kBlock, T - j0);
                        dot(qn, kn, HSp / 2, q, kp + j0, T, s, kBlock, false);
                        for (int64_t r = 0; r < qn; ++r) {
                            const int64_t last = std::min(kn, i0 + r - j0 + 1);  // keys <= query
                            alpha[r] = softmax_row(s + r * kBlock, p + r * kBlock, last, scale,
                                                   m + r, l + r);
                        }
                        dot(qn, HS, even(kn) / 2, row_major(p, kBlock), vp + j0 / 2 * HS, HS, o, HS,
                            j0 > 0, alpha);
                    }
                    for (int64_t r = 0; r < qn; ++r) {
                        to_bf16_row(out + (b * T + i0 + r) * C + h * HS, o + r * HS, HS,
                                    1.0f / l[r]);
                        lse[(b * NH + h) * T + i0 + r] = m[r] + std::log(l[r]);
                    }
                }
            }
        }
    }
}

namespace {

// P and dS of a query block against one key block, from the scores s and
// dP = dO V^T (both (qn, kBlock) fp32). Writes pp and dsp (pair rows over
// queries: P^T dO and dS^T Q read them as transposed pairs) and ds
// (row-major bf16, for dS K); entries past the last key are zero, and so is
// the pad row of an odd qn. Key c is live for row r while c < r + diag.
void gradient_rows(const float* s, const float* dp, int64_t qn, int64_t kn, int64_t diag,
                   float scale, const float* lse, const float* D, uint32_t* pp, uint32_t* dsp,
                   uint16_t* ds) {
    for (int64_t r = 0; r < qn; r += 2) {
        Vi p_pair[kBlock / 16], ds_pair[kBlock / 16];
        for (int64_t rr = r; rr < r + 2; ++rr) {
            const int64_t last = rr < qn ? std::min(kn, rr + diag) : 0;
            const float lr = rr < qn ? lse[rr] : 0.0f, dr = rr < qn ? D[rr] : 0.0f;
            for (int v = 0; v < kBlock / 16; ++v) {
                const Mask live = first_lanes(last - 16 * v);
                const Vf sv = maskz_loadu(live, s + rr * kBlock + 16 * v);
                const Vf dpv = maskz_loadu(live, dp + rr * kBlock + 16 * v);
                const Vf pv = maskz_mov(
                    live, simd::exp(sub(mul(sv, set1(scale)),
                                                   set1(lr))));
                // dS, scaled for Q K^T
                const Vf dsv =
                    mul(mul(pv, sub(dpv, set1(dr))),
                                  set1(scale));
                const Vi pb = bf16_lanes(pv), dsb = bf16_lanes(dsv);
                if (rr == r) {
                    p_pair[v] = pb;
                    ds_pair[v] = dsb;
                } else {
                    p_pair[v] = or_i(p_pair[v], shift_left_16(pb));
                    ds_pair[v] = or_i(ds_pair[v], shift_left_16(dsb));
                }
                if (rr < qn) {
                    store_low16(ds + rr * kBlock + 16 * v, dsb);
                }
            }
        }
        for (int v = 0; v < kBlock / 16; ++v) {
            storeu_i(pp + r / 2 * kBlock + 16 * v, p_pair[v]);
            storeu_i(dsp + r / 2 * kBlock + 16 * v, ds_pair[v]);
        }
    }
}

}  // namespace

void attention_backward_bf16(float* dqkv, const float* dout, const uint16_t* qkv,
                             const uint16_t* out, const float* lse, int64_t B, int64_t T,
                             int64_t NH, int64_t KVH, int64_t HS) {
    const Layout L{T, NH, KVH, HS, (NH + 2 * KVH) * HS};
    const int64_t group = NH / KVH, HSp = even(HS), C = NH * HS;
    const float scale = 1.0f / std::sqrt(float(HS));
#pragma omp parallel
    {
        uint32_t* kp = scratch<uint32_t, 0>(HSp / 2 * T);        // K^T pair rows, for Q K^T
        uint32_t* vtp = scratch<uint32_t, 1>(HSp / 2 * T);       // V^T pair rows, for dO V^T
        uint32_t* krp = scratch<uint32_t, 2>(even(T) / 2 * HS);  // K pair rows, for dS K
        uint32_t* qrp = scratch<uint32_t, 3>(kBlock / 2 * HS);   // Q_i pair rows, for dS^T Q
        uint32_t* dorp = scratch<uint32_t, 4>(kBlock / 2 * HS);  // dO_i pair rows, for P^T dO
        uint32_t* pp = scratch<uint32_t, 5>(kBlock / 2 * kBlock);
        uint32_t* dsp = scratch<uint32_t, 6>(kBlock / 2 * kBlock);
        uint16_t* qb = scratch<uint16_t, 0>(kBlock * HSp);
        uint16_t* dob = scratch<uint16_t, 1>(kBlock * HSp);
        uint16_t* ds = scratch<uint16_t, 2>(kBlock * kBlock);
        float* s = scratch<float, 0>(kBlock * kBlock);
        float* dp = scratch<float, 1>(kBlock * kBlock);
        float D[kBlock];
#pragma omp for schedule(dynamic)
        for (int64_t task = 0; task < B * KVH; ++task) {
            const int64_t b = task / KVH, kvh = task % KVH;
            const uint16_t* base = qkv + b * T * L.R;
            float* dbase = dqkv + b * T * L.R;
            pack_columns(kp, base + L.k(kvh), L.R, T, HS);
            pack_columns(vtp, base + L.v(kvh), L.R, T, HS);
            pack_rows(krp, base + L.k(kvh), L.R, T, HS);
            for (int64_t g = 0; g < group; ++g) {
                const int64_t h = kvh * group + g;
                for (int64_t i0 = 0; i0 < T; i0 += kBlock) {
                    const int64_t qn = std::min(kBlock, T - i0), qk2 = even(qn) / 2;
                    const uint16_t* q_src = base + i0 * L.R + L.q(h);
                    const Pairs q = query_block(q_src, L.R, qn, HS, qb);
                    const uint16_t* O = out + (b * T + i0) * C + h * HS;
                    const float* dO = dout + (b * T + i0) * C + h * HS;
                    for (int64_t r = 0; r < qn; ++r) {
                        D[r] = dot_row(dO + r * C, O + r * C, HS);
                        to_bf16_row(dob + r * HSp, dO + r * C, HS, 1.0f);
                        if (HSp != HS) dob[r * HSp + HS] = 0;
                    }
                    pack_rows(qrp, q_src, L.R, qn, HS);
                    pack_rows(dorp, dob, HSp, qn, HS);
                    const float* lse_row = lse + (b * NH + h) * T + i0;
                    for (int64_t j0 = 0; j0 <= i0; j0 += kBlock) {
                        const int64_t kn = std::min(kBlock, T - j0);
                        dot(qn, kn, HSp / 2, q, kp + j0, T, s, kBlock, false);
                        dot(qn, kn, HSp / 2, row_major(dob, HSp), vtp + j0, T, dp, kBlock, false);
                        gradient_rows(s, dp, qn, kn, i0 - j0 + 1, scale, lse_row, D, pp, dsp, ds);
                        // This task alone owns the dK, dV columns of its kv head;
                        // key block j0 is first reached at i0 = j0 by its first head.
                        const bool seen = g > 0 || j0 < i0;
                        // dV_j += P^T dO_i
                        dot(kn, HS, qk2, transposed_pair_rows(pp, kBlock), dorp, HS,
                            dbase + j0 * L.R + L.v(kvh), L.R, seen);
                        // dK_j += dS^T Q_i
                        dot(kn, HS, qk2, transposed_pair_rows(dsp, kBlock), qrp, HS,
                            dbase + j0 * L.R + L.k(kvh), L.R, seen);
                        // dQ_i += dS K_j
                        dot(qn, HS, even(kn) / 2, row_major(ds, kBlock), krp + j0 / 2 * HS, HS,
                            dbase + i0 * L.R + L.q(h), L.R, j0 > 0);
                    }
                }
            }
        }
    }
}

}  // namespace apiary::kernels
