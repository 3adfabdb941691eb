#pragma once
// 16-lane vectors for the kernels the compiler does not vectorise well on its
// own (register-blocked block products, masked row tails, 16 x 16 transposes,
// bf16 pair dot products). One source, two back ends:
//  - AVX-512 (F, BW, VL and BF16: the machines these kernels were tuned on):
//    every operation is one intrinsic, exactly the instructions the kernels
//    used before this layer existed.
//  - any other CPU (AVX2-only x86-64, or no x86 at all): GCC's generic vector
//    extension. A 64-byte vector lowers to two AVX2 registers (or four SSE
//    ones), so the same kernels build and run everywhere, within rounding of
//    the AVX-512 results (horizontal sums add in another order; fma may or may
//    not contract).
// No intrinsics library does this for us at GCC 12 without a new dependency
// (std::experimental::simd has no bf16 and no masked memory operations),
// hence the small hand-written layer.
//
// A Mask is a 16-bit lane set (bit i = lane i) on both back ends, so masks
// compare and combine the same way everywhere. Masked loads never touch the
// memory of a dead lane, and dead lanes read as zero (maskz) or as the given
// source (mask).
//
// bf16 rounding is round to nearest even with NaNs kept quiet, as
// vcvtneps2bf16 and core::f32_to_bf16 round.

// Vectors of 64 bytes as arguments make GCC warn (-Wpsabi) on CPUs without
// AVX-512; kernels/CMakeLists.txt says why that warning is switched off.

#include <cstdint>
#include <cstring>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512BF16__)
#define APIARY_SIMD_AVX512 1
#include <immintrin.h>
#endif

namespace apiary::kernels::simd {

#if defined(APIARY_SIMD_AVX512)

using Vf = __m512;   // 16 x float
using Vi = __m512i;  // 16 x 32-bit
using Mask = __mmask16;

inline Mask first_lanes(int64_t n) {
    return _cvtu32_mask16(n >= 16 ? 0xFFFFu : n > 0 ? (1u << n) - 1u : 0u);
}
inline Vf set1(float x) { return _mm512_set1_ps(x); }
inline Vf zero() { return _mm512_setzero_ps(); }
inline Vf loadu(const float* p) { return _mm512_loadu_ps(p); }
inline Vf maskz_loadu(Mask m, const float* p) { return _mm512_maskz_loadu_ps(m, p); }
inline Vf mask_loadu(Vf src, Mask m, const float* p) { return _mm512_mask_loadu_ps(src, m, p); }
inline void storeu(float* p, Vf x) { _mm512_storeu_ps(p, x); }
inline void mask_storeu(float* p, Mask m, Vf x) { _mm512_mask_storeu_ps(p, m, x); }
inline Vf add(Vf a, Vf b) { return _mm512_add_ps(a, b); }
inline Vf sub(Vf a, Vf b) { return _mm512_sub_ps(a, b); }
inline Vf mul(Vf a, Vf b) { return _mm512_mul_ps(a, b); }
inline Vf div(Vf a, Vf b) { return _mm512_div_ps(a, b); }
inline Vf max(Vf a, Vf b) { return _mm512_max_ps(a, b); }
inline Vf min(Vf a, Vf b) { return _mm512_min_ps(a, b); }
inline Vf fmadd(Vf a, Vf b, Vf c) { return _mm512_fmadd_ps(a, b, c); }
inline Vf maskz_mov(Mask m, Vf x) { return _mm512_maskz_mov_ps(m, x); }
inline Vf maskz_sub(Mask m, Vf a, Vf b) { return _mm512_maskz_sub_ps(m, a, b); }
inline Vf mask_sub(Vf src, Mask m, Vf a, Vf b) { return _mm512_mask_sub_ps(src, m, a, b); }
inline Vf mask_mul(Vf src, Mask m, Vf a, Vf b) { return _mm512_mask_mul_ps(src, m, a, b); }
inline float reduce_add(Vf x) { return _mm512_reduce_add_ps(x); }
inline float reduce_max(Vf x) { return _mm512_reduce_max_ps(x); }

// Round to nearest integer (ties to even), as float.
inline Vf round_nearest(Vf x) {
    return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
// 2^n for integral n in [-126, 127] given as float.
inline Vf exp2_integral(Vf n) {
    const __m512i e = _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127));
    return _mm512_castsi512_ps(_mm512_slli_epi32(e, 23));
}

inline Vi set1_i(uint32_t x) { return _mm512_set1_epi32(int(x)); }
inline Vi loadu_i(const uint32_t* p) { return _mm512_loadu_si512(p); }
inline Vi maskz_loadu_i(Mask m, const uint32_t* p) { return _mm512_maskz_loadu_epi32(m, p); }
inline void storeu_i(uint32_t* p, Vi x) { _mm512_storeu_si512(p, x); }
inline Vi or_i(Vi a, Vi b) { return _mm512_or_si512(a, b); }
inline Vi shift_left_16(Vi x) { return _mm512_slli_epi32(x, 16); }
// The low 16 bits of each lane to p (16 x uint16).
inline void store_low16(uint16_t* p, Vi x) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(x));
}

// bf16 rounding, to memory or zero-extended into 32-bit lanes.
inline void store_bf16(uint16_t* p, Vf x) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), (__m256i)_mm512_cvtneps_pbh(x));
}
inline void mask_store_bf16(uint16_t* p, Mask m, Vf x) {
    _mm256_mask_storeu_epi16(p, m, (__m256i)_mm512_cvtneps_pbh(x));
}
inline Vi bf16_lanes(Vf x) { return _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(x)); }
// 16 bf16 values at p (dead lanes zero) widened to fp32.
inline Vf maskz_load_bf16(Mask m, const uint16_t* p) {
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}
// acc + a.hi * b.hi + a.lo * b.lo per lane, each lane of a and b a pair of
// bf16 (vdpbf16ps).
inline Vf dot_bf16_pairs(Vf acc, Vi a, Vi b) {
    return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b);
}

// In place 16 x 16 transpose: r[i] holds row i on entry, column i on exit.
inline void transpose16(Vf r[16]) {
    __m512 t[16];
    for (int i = 0; i < 8; ++i) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; ++i) {
        const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 2]);
        const __m512d c = _mm512_castps_pd(t[4 * i + 1]), d = _mm512_castps_pd(t[4 * i + 3]);
        r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
        r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
        r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(c, d));
        r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(c, d));
    }
    for (int i = 0; i < 2; ++i) {
        for (int j = 0; j < 4; ++j) {
            t[8 * i + j] = _mm512_shuffle_f32x4(r[8 * i + j], r[8 * i + 4 + j], 0x88);
            t[8 * i + 4 + j] = _mm512_shuffle_f32x4(r[8 * i + j], r[8 * i + 4 + j], 0xdd);
        }
    }
    for (int j = 0; j < 8; ++j) {
        r[j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0x88);
        r[j + 8] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0xdd);
    }
}

#else  // generic vectors

typedef float Vf __attribute__((vector_size(64)));
typedef uint32_t Vi __attribute__((vector_size(64)));
typedef int32_t VsI __attribute__((vector_size(64)));
typedef uint16_t V16h __attribute__((vector_size(32)));
using Mask = uint32_t;

inline bool live(Mask m, int i) { return (m >> i) & 1u; }
inline Mask first_lanes(int64_t n) { return n >= 16 ? 0xFFFFu : n > 0 ? (1u << n) - 1u : 0u; }
inline Vf set1(float x) { return Vf{} + x; }
inline Vf zero() { return Vf{}; }
inline Vf loadu(const float* p) {
    Vf x;
    std::memcpy(&x, p, sizeof x);
    return x;
}
inline Vf mask_loadu(Vf src, Mask m, const float* p) {
    for (int i = 0; i < 16; ++i) {
        if (live(m, i)) src[i] = p[i];
    }
    return src;
}
inline Vf maskz_loadu(Mask m, const float* p) { return m == 0xFFFFu ? loadu(p) : mask_loadu(Vf{}, m, p); }
inline void storeu(float* p, Vf x) { std::memcpy(p, &x, sizeof x); }
inline void mask_storeu(float* p, Mask m, Vf x) {
    if (m == 0xFFFFu) return storeu(p, x);
    for (int i = 0; i < 16; ++i) {
        if (live(m, i)) p[i] = x[i];
    }
}
inline Vf add(Vf a, Vf b) { return a + b; }
inline Vf sub(Vf a, Vf b) { return a - b; }
inline Vf mul(Vf a, Vf b) { return a * b; }
inline Vf div(Vf a, Vf b) { return a / b; }
inline Vf max(Vf a, Vf b) { return a > b ? a : b; }
inline Vf min(Vf a, Vf b) { return a < b ? a : b; }
inline Vf fmadd(Vf a, Vf b, Vf c) { return a * b + c; }
// A lane-set as a vector condition: all ones in live lanes.
inline VsI lanes(Mask m) {
    const VsI bit = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768};
    return (bit & (VsI{} + int32_t(m))) != 0;
}
inline Vf select(Mask m, Vf a, Vf b) { return lanes(m) ? a : b; }
inline Vf maskz_mov(Mask m, Vf x) { return select(m, x, Vf{}); }
inline Vf maskz_sub(Mask m, Vf a, Vf b) { return select(m, a - b, Vf{}); }
inline Vf mask_sub(Vf src, Mask m, Vf a, Vf b) { return select(m, a - b, src); }
inline Vf mask_mul(Vf src, Mask m, Vf a, Vf b) { return select(m, a * b, src); }
inline float reduce_add(Vf x) {
    float s = 0.0f;
    for (int i = 0; i < 16; ++i) s += x[i];
    return s;
}
inline float reduce_max(Vf x) {
    float m = x[0];
    for (int i = 1; i < 16; ++i) m = m > x[i] ? m : x[i];
    return m;
}

// Round to nearest integer, ties to even: adding and removing 1.5 * 2^23
// leaves the integer part in the default rounding mode (|x| < 2^22; the
// callers clamp far below that).
inline Vf round_nearest(Vf x) {
    const Vf magic = set1(12582912.0f);
    return (x + magic) - magic;
}
inline Vf exp2_integral(Vf n) {
    const VsI e = __builtin_convertvector(n, VsI) + 127;
    return (Vf)(e << 23);
}

inline Vi set1_i(uint32_t x) { return Vi{} + x; }
inline Vi loadu_i(const uint32_t* p) {
    Vi x;
    std::memcpy(&x, p, sizeof x);
    return x;
}
inline Vi maskz_loadu_i(Mask m, const uint32_t* p) {
    if (m == 0xFFFFu) return loadu_i(p);
    Vi x{};
    for (int i = 0; i < 16; ++i) {
        if (live(m, i)) x[i] = p[i];
    }
    return x;
}
inline void storeu_i(uint32_t* p, Vi x) { std::memcpy(p, &x, sizeof x); }
inline Vi or_i(Vi a, Vi b) { return a | b; }
inline Vi shift_left_16(Vi x) { return x << 16; }
inline void store_low16(uint16_t* p, Vi x) {
    const V16h h = __builtin_convertvector(x, V16h);
    std::memcpy(p, &h, sizeof h);
}

inline Vi bf16_lanes(Vf x) {
    const Vi u = (Vi)x;
    const Vi rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const Vi quiet_nan = (u >> 16) | 0x40u;
    return (u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded;
}
inline void store_bf16(uint16_t* p, Vf x) { store_low16(p, bf16_lanes(x)); }
inline void mask_store_bf16(uint16_t* p, Mask m, Vf x) {
    const Vi b = bf16_lanes(x);
    for (int i = 0; i < 16; ++i) {
        if (live(m, i)) p[i] = uint16_t(b[i]);
    }
}
inline Vf maskz_load_bf16(Mask m, const uint16_t* p) {
    Vi w{};
    for (int i = 0; i < 16; ++i) {
        if (live(m, i)) w[i] = p[i];
    }
    return (Vf)(w << 16);
}
inline Vf dot_bf16_pairs(Vf acc, Vi a, Vi b) {
    const Vi hi = set1_i(0xffff0000u);
    return acc + (Vf)(a & hi) * (Vf)(b & hi) + (Vf)(a << 16) * (Vf)(b << 16);
}

inline void transpose16(Vf r[16]) {
    float t[16][16];
    for (int i = 0; i < 16; ++i) {
        for (int j = 0; j < 16; ++j) t[j][i] = r[i][j];
    }
    for (int i = 0; i < 16; ++i) r[i] = loadu(t[i]);
}

#endif

// fast_exp (vec_math.h) on 16 lanes: the same clamp, range reduction and
// polynomial, so the same results as the scalar version up to contraction.
inline Vf exp(Vf x) {
    x = min(max(x, set1(-87.0f)), set1(88.0f));
    const Vf fx = round_nearest(mul(x, set1(1.44269504088896341f)));
    Vf r = sub(x, mul(fx, set1(0.693359375f)));
    r = add(r, mul(fx, set1(2.12194440e-4f)));
    Vf p = set1(1.9875691500e-4f);
    p = add(mul(p, r), set1(1.3981999507e-3f));
    p = add(mul(p, r), set1(8.3334519073e-3f));
    p = add(mul(p, r), set1(4.1665795894e-2f));
    p = add(mul(p, r), set1(1.6666665459e-1f));
    p = add(mul(p, r), set1(5.0000001201e-1f));
    p = add(add(mul(mul(p, r), r), r), set1(1.0f));
    return mul(p, exp2_integral(fx));
}

}  // namespace apiary::kernels::simd
