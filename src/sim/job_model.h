#pragma once
// What one job costs on the simulated cluster, from `apiary plan`: the
// seconds of work (steps x the planner's step time), whether its layout fits
// in device memory, the time to write a checkpoint and the Young/Daly
// interval between them, and the power it draws while it runs. Jobs that
// give only a runtime get the cluster's defaults.

#include <map>
#include <string>

#include "core/config.h"
#include "plan/types.h"
#include "sim/trace.h"

namespace apiary::sim {

struct JobCost {
    double work_s = 0;                // useful work at full speed
    double step_s = 0;                // the planner's step time (0: runtime-only job)
    double ckpt_s = 0;                // one checkpoint write
    double ckpt_interval_s = kNever;  // work seconds between checkpoints
    double power_kw = 0;              // at the wall, PUE included, while it runs
    double mem_gib = 0;               // per device (planner)
    std::string reject;               // non-empty: it can never run, and why
};

class JobModel {
  public:
    // base: the resolved config (cluster.* keys, defaults for the model
    // keys); cluster: plan::cluster_from(base) for the whole machine.
    // default_interval_s: checkpoint interval of jobs without a model.
    JobModel(const core::Config& base, const plan::Cluster& cluster, double default_interval_s);

    JobCost cost(const JobSpec& job);  // cached per shape
    // Power of one device at the wall (PUE, host and network shares
    // included) at a busy fraction in [0, 1].
    double device_kw(double busy) const;
    const plan::Cluster& cluster() const { return cluster_; }

  private:
    JobCost planned(const JobSpec& job);
    core::Config base_;
    plan::Cluster cluster_;
    double default_interval_s_;
    std::map<std::string, JobCost> cache_;
};

}  // namespace apiary::sim
