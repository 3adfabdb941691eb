#pragma once
// What the trainer reads from the config, read once at the edge: every
// train.* key (and the few others the loop needs) parsed, range-checked and
// typed here, so that nothing below reads a raw key and nothing in the step
// loop parses a string. Other layers keep their own typed options
// (data::LoaderOptions, obs::ObsOptions, parallel_layout_from).

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "core/config.h"
#include "model/model.h"
#include "parallel/engine.h"
#include "train/checkpoint.h"

namespace apiary::train {

struct TrainOptions {
    std::string run_dir;
    // The step: B rows of T tokens per micro-step, grad_accum micro-steps.
    int64_t batch_size = 0, seq_len = 0, grad_accum = 1, steps = 0;
    uint64_t seed = 0;
    int64_t threads = 0;  // 0: the machine's cores
    model::Precision precision = model::Precision::fp32;
    std::string precision_name;  // as written in the config, for logs and checkpoints
    // The learning rate: warm-up, then cosine to min_lr, by steps or tokens.
    double lr = 0, min_lr = 0;
    int64_t warmup_steps = 0;
    bool lr_by_tokens = false;
    // Sequence-length curriculum (data.curriculum_*): 0 steps means none.
    int64_t curriculum_start = 0, curriculum_steps = 0;
    std::string curriculum_mode;
    // Logging and evaluation.
    int64_t log_every = 1, eval_every = 0, eval_batches = 0;
    // Checkpoints.
    int64_t ckpt_every = 0;
    double ckpt_mtbf_hours = 0;
    bool ckpt_every_auto = false;
    SaveOptions save;
    // Stability: roll back to the last checkpoint on a non-finite or
    // spiking loss (train.rollback, spike_*), at most max_rollbacks times.
    bool rollback = false;
    double spike_zscore = 0;
    int64_t spike_window = 0, max_rollbacks = 0;
    bool elastic = false;
    // The engine's options (precision, AdamW, loss scaler, buckets, freeze).
    parallel::EngineOptions engine;
    // Testing hook: loader batches (1-based) whose loss scale overflows.
    std::set<int64_t> inject_overflow_steps;

    // Throws ConfigError naming the key for a value out of range.
    static TrainOptions from_config(const core::Config& c);
    // Steps over which the curriculum grows (0: none).
    int64_t curriculum_growth_steps() const { return curriculum_start > 0 ? curriculum_steps : 0; }
};

// Everything that can be wrong with the config alone, checked before any
// file is touched or any large buffer allocated.
void validate_config(const core::Config& c, int world_size);

}  // namespace apiary::train
