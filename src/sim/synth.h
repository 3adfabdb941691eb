#pragma once
// Synthetic job traces for `apiary sim trace`: Poisson arrivals at a rate
// that offers a given load to the cluster, job sizes in powers of two with
// small jobs most common (p(2^k) ~ 2^(-k/2)), lognormal run times, time
// limits the user overestimates, and shares of spot, flexible, high-priority
// jobs and accounts. Deterministic in the seed.

#include <string>

#include "sim/trace.h"

namespace apiary::sim {

struct SynthOptions {
    long long jobs = 1000;
    long long devices = 64;     // the cluster the load is offered to
    long long max_devices = 0;  // largest job (0: devices / 4)
    double load = 0.9;          // offered device-seconds per available device-second
    double median_runtime_s = 3600;
    double runtime_sigma = 1.5;  // of log(runtime)
    double max_runtime_s = 7 * 86400;
    double limit_factor = 2;  // time limits up to this multiple of the run time
    double spot_frac = 0, flexible_frac = 0, high_priority_frac = 0.1;
    double slack_h = 24;  // a flexible job's deadline: submit + run + up to this
    int accounts = 4;
    uint64_t seed = 1;
};

Trace synthesize(const SynthOptions& o);

}  // namespace apiary::sim
