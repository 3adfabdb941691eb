#pragma once
// Helpers for kernel tests: random inputs from Philox, fp64 references, and
// central finite differences of an fp64 reference (so the check of a float
// backward is limited by float rounding, not by the difference step).

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <vector>

#include "core/rng.h"

namespace apiary::testing {

inline std::vector<float> random_vec(size_t n, uint64_t seed, float scale = 1.0f) {
    core::Philox rng(seed, 99);
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = rng.normal(i) * scale;
    return v;
}

inline std::vector<double> to_f64(const std::vector<float>& v) {
    return std::vector<double>(v.begin(), v.end());
}

// max |a - b| / (max |b| + tiny): a relative error that is not blown up by
// individual near-zero entries.
inline double rel_error(const float* a, const double* b, size_t n) {
    double num = 0.0, den = 1e-30;
    for (size_t i = 0; i < n; ++i) {
        num = std::max(num, std::fabs(double(a[i]) - b[i]));
        den = std::max(den, std::fabs(b[i]));
    }
    return num / den;
}
inline double rel_error(const std::vector<float>& a, const std::vector<double>& b) {
    EXPECT_EQ(a.size(), b.size());
    return rel_error(a.data(), b.data(), std::min(a.size(), b.size()));
}

// Gradient of L(x) = f(x) by central differences, f in fp64.
inline std::vector<double> finite_diff(const std::function<double(const std::vector<double>&)>& f,
                                       std::vector<double> x, double eps = 1e-6) {
    std::vector<double> g(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
        const double x0 = x[i];
        x[i] = x0 + eps;
        const double fp = f(x);
        x[i] = x0 - eps;
        const double fm = f(x);
        x[i] = x0;
        g[i] = (fp - fm) / (2 * eps);
    }
    return g;
}

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
    double s = 0;
    for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
    return s;
}

}  // namespace apiary::testing
