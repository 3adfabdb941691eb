// bf16 training's elementwise kernels that produce a matmul operand: they
// write it in bf16 directly. The fp32 value the fp32 kernels write is, in
// bf16 training, only ever read by to_bf16 (and, for a gradient, by the
// bias's column sums), so each of these saves a write and a read of an fp32
// activation and a parallel region. Same formulas as elementwise.cc (GELU
// through fast_exp16, which mirrors fast_exp); the layernorm's row sums are
// vectorised, so its statistics differ from the fp32 kernel's in rounding.

// GCC 12 warns inside its own AVX-512 intrinsics (a known false positive on
// the unused upper half of a mask register), as in matmul_bf16.cc.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cmath>

#include "kernels/cpu/vec_math.h"
#include "kernels/kernels.h"

namespace apiary::kernels {

namespace {

using detail::fast_exp16;

__mmask16 first_lanes(int64_t n) {
    return _cvtu32_mask16(n >= 16 ? 0xFFFFu : n > 0 ? (1u << n) - 1u : 0u);
}

void store_bf16(uint16_t* dst, __mmask16 m, __m512 x) {
    _mm256_mask_storeu_epi16(dst, m, (__m256i)_mm512_cvtneps_pbh(x));
}

__m512 set1(float x) { return _mm512_set1_ps(x); }

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)

// fast_tanh(x) = 1 - 2 / (exp(2x) + 1) on 16 lanes.
__m512 tanh16(__m512 x) {
    const __m512 e = fast_exp16(_mm512_mul_ps(set1(2.0f), x));
    return _mm512_sub_ps(set1(1.0f), _mm512_div_ps(set1(2.0f), _mm512_add_ps(e, set1(1.0f))));
}

// u = sqrt(2/pi) (v + 0.044715 v^3), as gelu_forward computes it.
__m512 gelu_arg(__m512 v) {
    const __m512 v3 = _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(set1(0.044715f), v), v), v);
    return _mm512_mul_ps(set1(kGeluScale), _mm512_add_ps(v, v3));
}

__m512 gelu16(__m512 v) {
    const __m512 half_v = _mm512_mul_ps(set1(0.5f), v);
    return _mm512_mul_ps(half_v, _mm512_add_ps(set1(1.0f), tanh16(gelu_arg(v))));
}

// d gelu / dv, as gelu_backward computes it.
__m512 gelu_grad16(__m512 v) {
    const __m512 th = tanh16(gelu_arg(v));
    const __m512 sech2 = _mm512_sub_ps(set1(1.0f), _mm512_mul_ps(th, th));
    const __m512 du = _mm512_mul_ps(
        set1(kGeluScale),
        _mm512_add_ps(set1(1.0f), _mm512_mul_ps(_mm512_mul_ps(set1(3.0f * 0.044715f), v), v)));
    const __m512 a = _mm512_mul_ps(set1(0.5f), _mm512_add_ps(set1(1.0f), th));
    const __m512 b = _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(set1(0.5f), v), sech2), du);
    return _mm512_add_ps(a, b);
}

}  // namespace

void gelu_forward_bf16(uint16_t* out, const float* x, int64_t n) {
#pragma omp parallel for schedule(static)
    for (int64_t i0 = 0; i0 < n; i0 += 4096) {
        const int64_t i1 = std::min(n, i0 + 4096);
        for (int64_t i = i0; i < i1; i += 16) {
            const __mmask16 m = first_lanes(i1 - i);
            store_bf16(out + i, m, gelu16(_mm512_maskz_loadu_ps(m, x + i)));
        }
    }
}

void gelu_backward_bf16(uint16_t* dx, float* col_sums, const float* x, const float* dout, int64_t N,
                        int64_t W) {
    // 64-column blocks in parallel, rows in order within a block: each
    // thread owns its columns' sums, added in the order linear_bias_backward
    // adds them.
#pragma omp parallel for schedule(static)
    for (int64_t j0 = 0; j0 < W; j0 += 64) {
        __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                         _mm512_setzero_ps()};
        for (int64_t i = 0; i < N; ++i) {
            for (int v = 0; v < 4; ++v) {
                const int64_t j = j0 + 16 * v;
                const __mmask16 m = first_lanes(W - j);
                const int64_t at = i * W + j;
                const __m512 g = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, dout + at),
                                               gelu_grad16(_mm512_maskz_loadu_ps(m, x + at)));
                acc[v] = _mm512_add_ps(acc[v], g);
                store_bf16(dx + at, m, g);
            }
        }
        if (!col_sums) continue;
        for (int v = 0; v < 4; ++v) {
            const int64_t j = j0 + 16 * v;
            const __mmask16 m = first_lanes(W - j);
            _mm512_mask_storeu_ps(col_sums + j, m,
                                  _mm512_add_ps(_mm512_maskz_loadu_ps(m, col_sums + j), acc[v]));
        }
    }
}

void to_bf16_column_sums(uint16_t* dst, float* col_sums, const float* src, int64_t N, int64_t W) {
#pragma omp parallel for schedule(static)
    for (int64_t j0 = 0; j0 < W; j0 += 64) {
        __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                         _mm512_setzero_ps()};
        for (int64_t i = 0; i < N; ++i) {
            for (int v = 0; v < 4; ++v) {
                const int64_t j = j0 + 16 * v;
                const __mmask16 m = first_lanes(W - j);
                const __m512 s = _mm512_maskz_loadu_ps(m, src + i * W + j);
                acc[v] = _mm512_add_ps(acc[v], s);
                store_bf16(dst + i * W + j, m, s);
            }
        }
        if (!col_sums) continue;
        for (int v = 0; v < 4; ++v) {
            const int64_t j = j0 + 16 * v;
            const __mmask16 m = first_lanes(W - j);
            _mm512_mask_storeu_ps(col_sums + j, m,
                                  _mm512_add_ps(_mm512_maskz_loadu_ps(m, col_sums + j), acc[v]));
        }
    }
}

void layernorm_forward_bf16(uint16_t* out, float* mean, float* rstd, const float* x,
                            const float* weight, const float* bias, int64_t N, int64_t C,
                            float eps) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; ++i) {
        const float* xi = x + i * C;
        __m512 s = _mm512_setzero_ps();
        for (int64_t c = 0; c < C; c += 16) {
            s = _mm512_add_ps(s, _mm512_maskz_loadu_ps(first_lanes(C - c), xi + c));
        }
        const float m = _mm512_reduce_add_ps(s) / float(C);
        __m512 var = _mm512_setzero_ps();
        for (int64_t c = 0; c < C; c += 16) {
            const __mmask16 k = first_lanes(C - c);
            const __m512 d = _mm512_maskz_sub_ps(k, _mm512_maskz_loadu_ps(k, xi + c), set1(m));
            var = _mm512_add_ps(var, _mm512_mul_ps(d, d));
        }
        const float r = 1.0f / std::sqrt(_mm512_reduce_add_ps(var) / float(C) + eps);
        for (int64_t c = 0; c < C; c += 16) {
            const __mmask16 k = first_lanes(C - c);
            const __m512 d = _mm512_sub_ps(_mm512_maskz_loadu_ps(k, xi + c), set1(m));
            const __m512 y = _mm512_add_ps(
                _mm512_mul_ps(_mm512_mul_ps(d, set1(r)), _mm512_maskz_loadu_ps(k, weight + c)),
                _mm512_maskz_loadu_ps(k, bias + c));
            store_bf16(out + i * C + c, k, y);
        }
        mean[i] = m;
        rstd[i] = r;
    }
}

}  // namespace apiary::kernels
