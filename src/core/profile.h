#pragma once
// A minimal region profiler: named wall-clock totals for the phases of a
// step (matmuls, attention, norms, head, optimizer), on when a benchmark
// asks for a breakdown and costing one branch when off. Called from the
// thread that drives the step (kernels parallelise inside a region).

#include <chrono>
#include <string>
#include <utility>
#include <vector>

namespace apiary::core {

class Profiler {
public:
    static Profiler& get();
    void enable(bool on) { enabled_ = on; }
    bool enabled() const { return enabled_; }
    void add(const char* region, double seconds);
    void reset() { totals_.clear(); }
    // (region, seconds), largest first.
    std::vector<std::pair<std::string, double>> totals() const;

private:
    bool enabled_ = false;
    std::vector<std::pair<const char*, double>> totals_;
};

class ProfileScope {
public:
    explicit ProfileScope(const char* region) : region_(region) {
        if (Profiler::get().enabled()) t0_ = std::chrono::steady_clock::now(), on_ = true;
    }
    ~ProfileScope() {
        if (on_) {
            Profiler::get().add(region_, std::chrono::duration<double>(
                                             std::chrono::steady_clock::now() - t0_)
                                             .count());
        }
    }

private:
    const char* region_;
    bool on_ = false;
    std::chrono::steady_clock::time_point t0_;
};

}  // namespace apiary::core

#define APIARY_PROFILE_CONCAT2(a, b) a##b
#define APIARY_PROFILE_CONCAT(a, b) APIARY_PROFILE_CONCAT2(a, b)
// APIARY_PROFILE("region"): time the rest of the enclosing scope.
#define APIARY_PROFILE(region) \
    ::apiary::core::ProfileScope APIARY_PROFILE_CONCAT(apiary_profile_, __LINE__)(region)
