#pragma once
// Best rate of a repeated operation over a time budget: peaks (GEMM FLOP/s)
// are reported as the best repetition, since a shared machine only ever
// slows a run down.

#include <algorithm>
#include <chrono>

namespace apiary::kernels::detail {

template <typename Fn>
double best_rate(double seconds, double work, Fn&& fn) {
    using Clock = std::chrono::steady_clock;
    double best = 0.0;
    const auto start = Clock::now();
    do {
        const auto t0 = Clock::now();
        fn();
        const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
        best = std::max(best, work / dt);
    } while (std::chrono::duration<double>(Clock::now() - start).count() < seconds);
    return best;
}

}  // namespace apiary::kernels::detail
