#pragma once
// Measuring: the one clock apiary times itself with, and the median that
// benchmarks report of repeated timings.

#include <chrono>
#include <vector>

namespace apiary::core {

using Clock = std::chrono::steady_clock;

// Seconds from t0 until now.
double seconds_since(Clock::time_point t0);

// The median of v (the mean of the middle two for an even count); NaN for
// an empty v.
double median(std::vector<double> v);

}  // namespace apiary::core
