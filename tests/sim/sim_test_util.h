#pragma once
// Helpers for the simulator tests: jobs built directly (a runtime, no
// planner), small clusters, and configs of the planner's schema.

#include <string>
#include <vector>

#include "../plan/test_util.h"
#include "core/config.h"
#include "core/error.h"
#include "plan/planner.h"
#include "sim/cluster_sim.h"

namespace apiary::sim::test {

// The message of the Error (DataError, ConfigError, ...) that `f` throws
// ("" if none).
template <class F>
std::string error_of(F f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

// A config of the planner's schema (the CLI's, less the trainer's keys).
inline core::Config config(const std::vector<std::string>& sets) {
    core::Config c(plan::test::schema());
    for (const auto& s : sets) c.set(s);
    return c;
}

// A job of `devices` that works `runtime` seconds, with free continuous
// checkpoints unless told otherwise.
inline SimJob job(const std::string& id, double submit, long long devices, double runtime,
                  double time_limit = -1) {
    SimJob j;
    j.spec.id = id;
    j.spec.where = "test";
    j.spec.submit = submit;
    j.spec.devices = devices;
    j.spec.runtime = runtime;
    j.spec.time_limit = time_limit;
    j.cost.work_s = runtime;
    j.cost.ckpt_interval_s = 0;
    j.cost.power_kw = 1.0 * double(devices);
    return j;
}

inline SimConfig cluster(int nodes, int per_node) {
    SimConfig c;
    c.nodes = nodes;
    c.per_node = per_node;
    c.carbon = Profile::constant(400);
    return c;
}

}  // namespace apiary::sim::test
