#include "sim/job_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "plan/planner.h"
#include "plan/totals.h"

namespace apiary::sim {

JobModel::JobModel(const core::Config& base, const plan::Cluster& cluster,
                   double default_interval_s)
    : base_(base), cluster_(cluster), default_interval_s_(default_interval_s) {}

double JobModel::device_kw(double busy) const {
    const auto& d = cluster_.dev;
    const double dev_w = d.tdp_w * (cluster_.idle_frac + (1 - cluster_.idle_frac) * busy);
    const double per_node = double(std::max(1, d.devices_per_node));
    const double w = dev_w + d.host_w_per_node / per_node + cluster_.network_w_per_device;
    return w * cluster_.pue / 1000;
}

namespace {

std::string shape_key(const JobSpec& j) {
    return fmt::format("{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}", j.model, j.devices, j.tp,
                       j.pp, j.zero, j.micro_batch, j.global_batch, j.seq_len, j.precision,
                       j.recompute, j.steps, j.tokens, j.runtime, j.checkpoint_s,
                       j.checkpoint_interval_s);
}

}  // namespace

// The planner's view: the job's layout on `devices` devices of this cluster.
JobCost JobModel::planned(const JobSpec& j) {
    JobCost c;
    core::Config cfg = base_;
    const std::string src = "trace " + j.where;
    auto set_int = [&](const char* key, long long v) { cfg.set_value(key, int64_t(v), src); };
    try {
        cfg.set_value("model.preset", j.model, src);
        set_int("cluster.gpus", j.devices);
        set_int("parallel.tp", j.tp);
        set_int("parallel.pp", j.pp);
        set_int("parallel.dp", 0);
        set_int("parallel.zero_stage", j.zero);
        set_int("parallel.microbatches", 0);
        set_int("train.batch_size", j.micro_batch);
        if (j.global_batch > 0) set_int("plan.global_batch", j.global_batch);
        if (j.seq_len > 0) set_int("train.seq_len", j.seq_len);
        if (!j.precision.empty()) cfg.set_value("train.precision", j.precision, src);
        if (!j.recompute.empty()) cfg.set_value("parallel.recompute", j.recompute, src);
        const plan::PlanInput in = plan::plan_input(cfg);
        const plan::Plan p = plan::evaluate(in.w, in.l, in.c);
        if (!p.fits) {
            c.reject = "does not fit in device memory: " + p.why;
            return c;
        }
        c.step_s = p.st.total;
        const double tokens_per_step = double(in.w.global_batch) * in.w.seq_len;
        const double steps = j.steps > 0 ? j.steps : j.tokens / tokens_per_step;
        c.work_s = j.runtime > 0 ? j.runtime : steps * c.step_s;
        c.ckpt_s = in.c.ckpt_write_s > 0 ? in.c.ckpt_write_s
                                         : (p.mem.params + p.mem.optimizer) / in.c.ckpt_bw;
        const double mtbf_s = in.c.mtbf_node_hours * 3600 / double(in.c.nodes());
        c.ckpt_interval_s = plan::daly_interval_s(c.ckpt_s, mtbf_s);
        c.power_kw = p.tot.power_kw;
        c.mem_gib = p.mem.total() / (1024.0 * 1024 * 1024);
    } catch (const ConfigError& e) {
        c.reject = fmt::format("the planner cannot lay it out: {}", e.what());
    }
    return c;
}

JobCost JobModel::cost(const JobSpec& j) {
    const std::string key = shape_key(j);
    if (auto it = cache_.find(key); it != cache_.end()) return it->second;
    JobCost c;
    if (!j.model.empty()) {
        c = planned(j);
    } else {
        c.work_s = j.runtime;
        c.ckpt_s = cluster_.ckpt_write_s;
        c.ckpt_interval_s = default_interval_s_ > 0 ? default_interval_s_ : kNever;
        c.power_kw = double(j.devices) * device_kw(1.0);
    }
    if (j.checkpoint_s >= 0) c.ckpt_s = j.checkpoint_s;
    if (j.checkpoint_interval_s > 0) c.ckpt_interval_s = j.checkpoint_interval_s;
    cache_[key] = c;
    return c;
}

}  // namespace apiary::sim
