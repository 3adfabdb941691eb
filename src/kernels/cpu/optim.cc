// AdamW and gradient-norm helpers: single passes over the flat buffers,
// memory-bound, so each touches every array exactly once.

#include <cmath>

#include "kernels/kernels.h"

namespace apiary::kernels {

void adamw_update(float* param, const float* grad, float* m, float* v, int64_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int64_t t,
                  float grad_scale) {
    const float bc1 = 1.0f - float(std::pow(double(beta1), double(t)));
    const float bc2 = 1.0f - float(std::pow(double(beta2), double(t)));
    const float step = lr / bc1;
    const float inv_sqrt_bc2 = 1.0f / std::sqrt(bc2);
    const float decay = 1.0f - lr * weight_decay;
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) {
        const float g = grad[i] * grad_scale;
        const float mi = beta1 * m[i] + (1.0f - beta1) * g;
        const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
        m[i] = mi;
        v[i] = vi;
        const float denom = std::sqrt(vi) * inv_sqrt_bc2 + eps;
        param[i] = param[i] * decay - step * mi / denom;
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
