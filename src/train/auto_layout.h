#pragma once
// parallel.layout = auto: the planner chooses the layout a run trains with.

#include <string>

#include "core/config.h"
#include "plan/types.h"

namespace apiary::train {

struct LayoutChoice {
    core::Config config;  // the run's config with the chosen layout's keys set
    std::string report;   // why: the chosen layout, its predicted step, the runners-up
    bool chosen = false;  // false: parallel.layout = manual, config unchanged
};

// With parallel.layout = auto, searches every layout of `world_size` ranks
// (ranks_per_node of them per host) for this model and global batch with
// the planner (`apiary plan search`, with plan.calibration when set) and
// returns the config of the fastest that the trainer accepts: parallel.tp,
// pp, dp, zero_stage, recompute, sequence_parallel, schedule,
// virtual_stages, train.batch_size and train.grad_accum are set, and
// plan.global_batch pins the global batch so that a resume chooses the
// same way. The global batch is plan.global_batch, or train.batch_size x
// train.grad_accum x the data-parallel ranks of the layout as given.
// Deterministic: every rank computes the same choice. Throws ConfigError
// when no layout fits, naming what the leanest one needs.
LayoutChoice choose_layout(const core::Config& config, int world_size, int ranks_per_node);

// The trainer's keys for one of the planner's layouts, at a global batch.
core::Config with_layout(const core::Config& config, const plan::Layout& l, long long global_batch);

}  // namespace apiary::train
