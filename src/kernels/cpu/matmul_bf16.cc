// bf16 matrix multiply with fp32 accumulation and fp32 output, through
// oneDNN's matmul primitive (on an AVX512_BF16 CPU about 700 GFLOP/s with
// two threads, against about 380 for fp32 sgemm; oneDNN emulates bf16 on
// other AVX-512 CPUs). oneDNN has no bf16 BLAS
// call, and creating a primitive costs far more than a small multiply, so
// primitives are cached per (shape, strides, accumulate): a training run
// uses a few dozen.
//
// oneDNN (2.6, Debian 12) has no bf16 matmul at all on CPUs without
// AVX-512 (AVX2 machines): creating the primitive fails as "unimplemented".
// There the operands are widened to fp32, which is exact (every bf16 value is
// an fp32 value, and so is the product of two), and multiplied by oneDNN's
// fp32 sgemm, which accumulates in fp32 as the bf16 primitive does: the same
// products summed in another order, at fp32 speed. The switch is made once,
// on the first primitive that cannot be created, and said once on stderr.

// GCC 12 warns inside its own AVX-512 conversion intrinsics (a known false
// positive on the unused upper half of a mask register).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#if defined(__F16C__)
#include <immintrin.h>
#endif
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"
#include "kernels/cpu/best_rate.h"
#include "kernels/cpu/simd.h"
#include "kernels/kernels.h"

namespace apiary::kernels {

using namespace simd;  // NOLINT: the 16-lane vocabulary of these kernels

namespace {

// (trans_a, trans_b, M, N, K, lda, ldb, ldc, accumulate, bias, bf16 output)
using Key =
    std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool, bool, bool>;

struct Cache {
    dnnl::engine engine{dnnl::engine::kind::cpu, 0};
    dnnl::stream stream{engine};
    std::map<Key, std::pair<dnnl::matmul, dnnl::matmul::primitive_desc>> prims;
    std::mutex mutex;
};

Cache& cache() {
    static Cache c;
    return c;
}

// C (M, N) = op(A) op(B) (+ C when beta = 1) (+ bias (N) broadcast over rows);
// C is fp32, or bf16 (rounded to nearest even) when c_bf16.
// -1 not yet known, 1 oneDNN's bf16 primitive, 0 widened to fp32.
std::atomic<int> g_native{-1};
std::atomic<bool> g_forced_widening{false};

// The rows x cols matrix at src (leading dimension ld) widened into dst
// (leading dimension cols).
void widen(float* dst, const uint16_t* src, int64_t rows, int64_t cols, int64_t ld) {
#pragma omp parallel for schedule(static) if (rows * cols > 65536)
    for (int64_t r = 0; r < rows; ++r) {
        const uint16_t* s = src + r * ld;
        float* d = dst + r * cols;
        for (int64_t j = 0; j < cols; ++j) d[j] = core::bf16_to_f32(s[j]);
    }
}

// matmul_bf16's contract through fp32 sgemm on widened copies (see the top).
void matmul_widened(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const uint16_t* A,
                    int64_t lda, const uint16_t* B, int64_t ldb, float beta, const float* bias,
                    void* C, int64_t ldc, bool c_bf16) {
    // Stored shapes: op(A) is M x K, so A is K x M when transposed.
    const int64_t a_rows = trans_a ? K : M, a_cols = trans_a ? M : K;
    const int64_t b_rows = trans_b ? N : K, b_cols = trans_b ? K : N;
    // Grow-only scratch, kept between calls: a fresh allocation per GEMM
    // would fault its pages in every time (they cost more than the copy).
    thread_local std::vector<float> a, b, c16;  // c16: the fp32 result when C is bf16
    a.resize(std::max(a.size(), size_t(a_rows * a_cols)));
    b.resize(std::max(b.size(), size_t(b_rows * b_cols)));
    widen(a.data(), A, a_rows, a_cols, lda);
    widen(b.data(), B, b_rows, b_cols, ldb);
    float* out = static_cast<float*>(C);
    int64_t ldo = ldc;
    if (c_bf16) {
        c16.resize(std::max(c16.size(), size_t(M * N)));
        if (beta == 1.0f) widen(c16.data(), static_cast<const uint16_t*>(C), M, N, ldc);
        out = c16.data();
        ldo = N;
    }
    gemm(trans_a, trans_b, M, N, K, a.data(), a_cols, b.data(), b_cols, beta, out, ldo);
    if (bias) {
#pragma omp parallel for schedule(static) if (M * N > 65536)
        for (int64_t r = 0; r < M; ++r) {
            for (int64_t j = 0; j < N; ++j) out[r * ldo + j] += bias[j];
        }
    }
    if (c_bf16) {
        auto* c = static_cast<uint16_t*>(C);
        for (int64_t r = 0; r < M; ++r) to_bf16(c + r * ldc, out + r * N, N);
    }
}

void matmul_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const uint16_t* A,
                 int64_t lda, const uint16_t* B, int64_t ldb, float beta, const float* bias,
                 void* C, int64_t ldc, bool c_bf16 = false) {
    if (M == 0 || N == 0) return;
    APIARY_CHECK(beta == 0.0f || beta == 1.0f, "gemm_bf16: beta must be 0 or 1, got {}", beta);
    if (g_forced_widening.load() || g_native.load() == 0) {
        matmul_widened(trans_a, trans_b, M, N, K, A, lda, B, ldb, beta, bias, C, ldc, c_bf16);
        return;
    }
    using dt = dnnl::memory::data_type;
    using dims = dnnl::memory::dims;
    Cache& c = cache();
    const Key key{trans_a, trans_b, M, N, K, lda, ldb, ldc, beta == 1.0f, bias != nullptr, c_bf16};
    const dnnl::matmul* prim = nullptr;
    const dnnl::matmul::primitive_desc* pd = nullptr;
    bool unimplemented = false;
    {
        std::lock_guard lock(c.mutex);
        auto it = c.prims.find(key);
        if (it == c.prims.end()) {
            // Transposes are expressed as strides of a plain 2-D descriptor.
            const dnnl::memory::desc a_md({M, K}, dt::bf16, trans_a ? dims{1, lda} : dims{lda, 1});
            const dnnl::memory::desc b_md({K, N}, dt::bf16, trans_b ? dims{1, ldb} : dims{ldb, 1});
            const dnnl::memory::desc c_md({M, N}, c_bf16 ? dt::bf16 : dt::f32, dims{ldc, 1});
            dnnl::primitive_attr attr;
            if (beta == 1.0f) {
                dnnl::post_ops po;
                po.append_sum(1.0f);
                attr.set_post_ops(po);
            }
            const auto desc =
                bias ? dnnl::matmul::desc(a_md, b_md,
                                          dnnl::memory::desc({1, N}, dt::f32, dims{N, 1}), c_md)
                     : dnnl::matmul::desc(a_md, b_md, c_md);
            dnnl::matmul::primitive_desc p;
            try {
                p = dnnl::matmul::primitive_desc(desc, attr, c.engine);
            } catch (const dnnl::error& e) {
                if (e.status != dnnl_unimplemented) throw;
                unimplemented = true;
            }
            if (!unimplemented) {
                g_native.store(1);
                it = c.prims.emplace(key, std::make_pair(dnnl::matmul(p), p)).first;
            }
        }
        if (!unimplemented) {
            prim = &it->second.first;
            pd = &it->second.second;
        }
    }
    if (unimplemented) {
        if (g_native.exchange(0) != 0) {
            std::fprintf(stderr,
                         "apiary: oneDNN has no bf16 matrix multiply on this CPU; bf16 GEMMs run "
                         "as fp32 GEMMs on widened operands (same products, fp32 speed)\n");
        }
        matmul_widened(trans_a, trans_b, M, N, K, A, lda, B, ldb, beta, bias, C, ldc, c_bf16);
        return;
    }
    dnnl::memory a(pd->src_desc(), c.engine, const_cast<uint16_t*>(A));
    dnnl::memory b(pd->weights_desc(), c.engine, const_cast<uint16_t*>(B));
    dnnl::memory d(pd->dst_desc(), c.engine, C);
    std::unordered_map<int, dnnl::memory> args{
        {DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, d}};
    if (bias) {
        args.emplace(DNNL_ARG_BIAS,
                     dnnl::memory(pd->bias_desc(), c.engine, const_cast<float*>(bias)));
    }
    prim->execute(c.stream, args);
    c.stream.wait();
}

}  // namespace

bool gemm_bf16_is_native() {
    if (g_forced_widening.load()) return false;
    if (g_native.load() < 0) {
        // One small multiply settles it.
        const uint16_t one = 0x3f80;
        float c = 0.0f;
        matmul_bf16(false, false, 1, 1, 1, &one, 1, &one, 1, 0.0f, nullptr, &c, 1);
    }
    return g_native.load() == 1;
}

void force_gemm_bf16_widening(bool on) { g_forced_widening.store(on); }

void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const uint16_t* A,
               int64_t lda, const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc) {
    matmul_bf16(trans_a, trans_b, M, N, K, A, lda, B, ldb, beta, nullptr, C, ldc);
}

void to_bf16(uint16_t* dst, const float* src, int64_t n) {
    // vcvtneps2bf16: round to nearest even, 16 at a time.
#pragma omp parallel for schedule(static)
    for (int64_t i0 = 0; i0 < n; i0 += 4096) {
        const int64_t i1 = std::min(n, i0 + 4096);
        int64_t i = i0;
        for (; i + 16 <= i1; i += 16) {
            store_bf16(dst + i, loadu(src + i));
        }
        for (; i < i1; ++i) dst[i] = core::f32_to_bf16(src[i]);
    }
}

void round_to_f16(float* x, int64_t n) {
    // Through F16C where the CPU has it: values land on the fp16 grid, beyond 65504 become inf.
#pragma omp parallel for schedule(static)
    for (int64_t i0 = 0; i0 < n; i0 += 4096) {
        const int64_t i1 = std::min(n, i0 + 4096);
        int64_t i = i0;
#if defined(__F16C__)
        for (; i + 8 <= i1; i += 8) {
            const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT);
            _mm256_storeu_ps(x + i, _mm256_cvtph_ps(h));
        }
        for (; i < i1; ++i) {
            const __m128i h = _mm_cvtps_ph(_mm_set_ss(x[i]), _MM_FROUND_TO_NEAREST_INT);
            x[i] = _mm_cvtss_f32(_mm_cvtph_ps(h));
        }
#else
        for (; i < i1; ++i) x[i] = core::f16_to_f32(core::f32_to_f16(x[i]));
#endif
    }
}

void copy_round_to_f16(float* dst, const float* src, int64_t n) {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) dst[i] = src[i];
    round_to_f16(dst, n);
}

void linear_forward_bf16(float* y, const uint16_t* x, const uint16_t* weight, const float* bias,
                         int64_t N, int64_t IN, int64_t OUT) {
    // The bias goes in as oneDNN's bias argument: no pass over y before the GEMM.
    matmul_bf16(false, true, N, OUT, IN, x, IN, weight, IN, 0.0f, bias, y, OUT);
}

void linear_forward_bf16_out(uint16_t* y, const uint16_t* x, const uint16_t* weight,
                             const float* bias, int64_t N, int64_t IN, int64_t OUT) {
    matmul_bf16(false, true, N, OUT, IN, x, IN, weight, IN, 0.0f, bias, y, OUT, true);
}

void linear_backward_bf16(float* dx, float* dweight, const uint16_t* dy, const uint16_t* x,
                          const uint16_t* weight, int64_t N, int64_t IN, int64_t OUT) {
    if (dx) gemm_bf16(false, false, N, IN, OUT, dy, OUT, weight, IN, 0.0f, dx, IN);
    gemm_bf16(true, false, OUT, IN, N, dy, OUT, x, IN, 1.0f, dweight, IN);
}

double measure_gemm_bf16_peak_flops(double seconds) {
    constexpr int64_t n = 1024;
    std::vector<uint16_t> a(n * n, 0x3f00), b(n * n, 0x3e80);  // 0.5 and 0.25
    std::vector<float> c(n * n);
    gemm_bf16(false, false, n, n, n, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    APIARY_CHECK(c[0] == 0.125f * n, "bf16 gemm self-check failed: {} != {}", c[0], 0.125f * n);
    return detail::best_rate(seconds, 2.0 * n * n * n, [&] {
        gemm_bf16(false, false, n, n, n, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    });
}

}  // namespace apiary::kernels
