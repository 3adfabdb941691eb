// AdamW and gradient-norm helpers: single passes over the flat buffers,
// memory-bound, so each touches every array exactly once.

// GCC 12 warns inside its own AVX-512 intrinsics (a known false positive on
// the unused upper half of a mask register), as in matmul_bf16.cc.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/simd.h"
#include "kernels/kernels.h"

namespace apiary::kernels {

using namespace simd;  // NOLINT: the 16-lane vocabulary of these kernels

namespace {

struct AdamWConstants {
    float beta1, beta2, eps, step, inv_sqrt_bc2, decay, grad_scale;
};

AdamWConstants adamw_constants(float lr, float beta1, float beta2, float eps, float weight_decay,
                               int64_t t, float grad_scale) {
    const float bc1 = 1.0f - float(std::pow(double(beta1), double(t)));
    const float bc2 = 1.0f - float(std::pow(double(beta2), double(t)));
    return {beta1, beta2, eps, lr / bc1, 1.0f / std::sqrt(bc2), 1.0f - lr * weight_decay,
            grad_scale};
}

// Elements [i0, i1): the one definition of the update both entry points use.
inline void adamw_elements(const AdamWConstants& k, float* param, const float* grad, float* m,
                           float* v, int64_t i0, int64_t i1) {
#pragma omp simd
    for (int64_t i = i0; i < i1; ++i) {
        const float g = grad[i] * k.grad_scale;
        const float mi = k.beta1 * m[i] + (1.0f - k.beta1) * g;
        const float vi = k.beta2 * v[i] + (1.0f - k.beta2) * g * g;
        m[i] = mi;
        v[i] = vi;
        const float denom = std::sqrt(vi) * k.inv_sqrt_bc2 + k.eps;
        param[i] = param[i] * k.decay - k.step * mi / denom;
    }
}

// Chunks small enough that the bf16 cast reads the updated weights from L1.
constexpr int64_t kChunk = 2048;

}  // namespace

void adamw_update(float* param, const float* grad, float* m, float* v, int64_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int64_t t,
                  float grad_scale) {
    const AdamWConstants k =
        adamw_constants(lr, beta1, beta2, eps, weight_decay, t, grad_scale);
#pragma omp parallel for schedule(static)
    for (int64_t i0 = 0; i0 < n; i0 += kChunk) {
        adamw_elements(k, param, grad, m, v, i0, std::min(n, i0 + kChunk));
    }
}

void adamw_update_bf16_copy(float* param, uint16_t* param_bf16, const float* grad, float* m,
                            float* v, int64_t n, float lr, float beta1, float beta2, float eps,
                            float weight_decay, int64_t t, float grad_scale) {
    const AdamWConstants k =
        adamw_constants(lr, beta1, beta2, eps, weight_decay, t, grad_scale);
#pragma omp parallel for schedule(static)
    for (int64_t i0 = 0; i0 < n; i0 += kChunk) {
        const int64_t i1 = std::min(n, i0 + kChunk);
        adamw_elements(k, param, grad, m, v, i0, i1);
        // The same rounding as to_bf16 (vcvtneps2bf16), so the copy is what
        // a separate cast of the weights would have written.
        for (int64_t i = i0; i < i1; i += 16) {
            const Mask live = first_lanes(i1 - i);
            mask_store_bf16(param_bf16 + i, live, maskz_loadu(live, param + i));
        }
    }
}

double sum_squares(const float* x, int64_t n) {
    // Blocks of float partial sums (vectorised), added in double in a fixed
    // order so the result does not depend on the thread count.
    constexpr int64_t kChunk = 4096;
    const int64_t chunks = (n + kChunk - 1) / kChunk;
    double total = 0.0;
#pragma omp parallel for schedule(static) reduction(+ : total) ordered
    for (int64_t c = 0; c < chunks; ++c) {
        const int64_t i0 = c * kChunk, i1 = std::min(n, i0 + kChunk);
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (int64_t i = i0; i < i1; ++i) s += x[i] * x[i];
        total += double(s);
    }
    return total;
}

void scale_inplace(float* x, int64_t n, float s) {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

void add_inplace(float* y, const float* x, int64_t n) {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

}  // namespace apiary::kernels
