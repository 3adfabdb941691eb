#include "sim/synth.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/rng.h"

namespace apiary::sim {

namespace {

// Standard normal from two uniforms (Box-Muller, cosine branch).
double normal(double u1, double u2) {
    return std::sqrt(-2 * std::log1p(-u1)) * std::cos(2 * M_PI * u2);
}

}  // namespace

Trace synthesize(const SynthOptions& o) {
    if (o.jobs < 1 || o.devices < 1 || o.load <= 0) {
        throw ConfigError(
            fmt::format("sim trace: need jobs >= 1, devices >= 1 and load > 0 (got "
                        "{}, {}, {})",
                        o.jobs, o.devices, o.load));
    }
    const long long max_dev = o.max_devices > 0 ? std::min(o.max_devices, o.devices)
                                                : std::max<long long>(1, o.devices / 4);
    // Sizes 1, 2, 4, ... up to max_dev with weights 2^(-k/2).
    std::vector<double> sizes, cdf;
    double total = 0, mean_dev = 0;
    for (long long d = 1; d <= max_dev; d *= 2) {
        const double w = std::pow(2.0, -0.5 * std::log2(double(d)));
        sizes.push_back(double(d));
        total += w;
        cdf.push_back(total);
        mean_dev += w * double(d);
    }
    mean_dev /= total;
    const double mean_run = std::min(
        o.max_runtime_s, o.median_runtime_s * std::exp(o.runtime_sigma * o.runtime_sigma / 2));
    const double rate = o.load * double(o.devices) / (mean_dev * mean_run);  // jobs per second
    const core::Philox rng(o.seed, 3);
    Trace t;
    t.source = fmt::format("synthetic (seed {})", o.seed);
    double now = 0;
    for (long long i = 0; i < o.jobs; ++i) {
        auto u = [&](int k) { return rng.uniform_f64(uint64_t(i) * 10 + uint64_t(k)); };
        now += -std::log1p(-u(0)) / rate;
        JobSpec j;
        j.id = fmt::format("j{}", i + 1);
        j.where = "synthetic";
        j.submit = std::round(now);
        const double pick = u(1) * total;
        j.devices =
            (long long)sizes[size_t(std::lower_bound(cdf.begin(), cdf.end(), pick) - cdf.begin())];
        const double run = o.median_runtime_s * std::exp(o.runtime_sigma * normal(u(2), u(3)));
        j.runtime = std::round(std::clamp(run, 60.0, o.max_runtime_s));
        j.time_limit = std::ceil(j.runtime * (1 + (o.limit_factor - 1) * u(4)) / 60) * 60;
        j.account = fmt::format("acct{}", 1 + int(u(5) * o.accounts) % std::max(1, o.accounts));
        j.priority = u(6) < o.high_priority_frac ? 1 : 0;
        j.spot = u(7) < o.spot_frac;
        if (u(8) < o.flexible_frac) {
            j.flexible = true;
            j.deadline = std::round(j.submit + j.time_limit + o.slack_h * 3600 * u(9));
        }
        t.jobs.push_back(std::move(j));
    }
    return t;
}

}  // namespace apiary::sim
