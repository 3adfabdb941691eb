#include "sim/cluster_sim.h"

#include <fmt/format.h>

#include "core/error.h"
#include "sim/text.h"

namespace apiary::sim {

Policy parse_policy(const std::string& name) {
    Policy p;
    p.name = name;
    const auto parts = split(name, '+');
    const std::string& base = parts[0];
    if (base == "fifo") {
        p.order = Order::submit;
    } else if (base == "backfill") {
        p.order = Order::submit, p.backfill = true;
    } else if (base == "priority") {
        p.order = Order::priority, p.backfill = true;
    } else if (base == "twolevel") {
        p.order = Order::fairshare, p.backfill = true;
    } else {
        throw ConfigError(fmt::format(
            "--policies: unknown policy '{}' (known: fifo, backfill, priority, twolevel; each "
            "may add +preempt and +carbon, e.g. twolevel+preempt)",
            base));
    }
    for (size_t i = 1; i < parts.size(); ++i) {
        if (parts[i] == "preempt") {
            p.preempt = true;
        } else if (parts[i] == "carbon") {
            p.carbon = true;
        } else {
            throw ConfigError(
                fmt::format("--policies: unknown modifier '+{}' in '{}' (known: +preempt, +carbon)",
                            parts[i], name));
        }
    }
    return p;
}

const char* job_state_name(JobState s) {
    switch (s) {
        case JobState::rejected:
            return "rejected";
        case JobState::completed:
            return "completed";
        case JobState::timeout:
            return "timeout";
        case JobState::unfinished:
            return "unfinished";
    }
    return "?";
}

namespace {

std::string capacity_problem(const JobSpec& s, const SimConfig& cfg) {
    if (s.spot) {
        const long long spot = (long long)cfg.spot_nodes_max * cfg.per_node;
        if (spot == 0) {
            return "a spot job, but the cluster has no spot capacity (give --spot-profile)";
        }
        if (s.devices > spot) {
            return fmt::format("needs {} devices but spot capacity peaks at {} ({} nodes x {})",
                               s.devices, spot, cfg.spot_nodes_max, cfg.per_node);
        }
        return "";
    }
    if (s.devices > cfg.devices()) {
        return fmt::format("needs {} devices but the cluster has {} ({} nodes x {})", s.devices,
                           cfg.devices(), cfg.nodes, cfg.per_node);
    }
    return "";
}

}  // namespace

std::vector<SimJob> prepare_jobs(const Trace& trace, JobModel& model, const SimConfig& cfg) {
    std::vector<SimJob> out;
    out.reserve(trace.jobs.size());
    for (const auto& spec : trace.jobs) {
        SimJob j;
        j.spec = spec;
        j.reject = spec.reject;
        if (j.reject.empty()) j.reject = capacity_problem(spec, cfg);
        if (j.reject.empty()) {
            j.cost = model.cost(spec);
            j.reject = j.cost.reject;
        }
        out.push_back(std::move(j));
    }
    return out;
}

}  // namespace apiary::sim
