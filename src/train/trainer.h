#pragma once
// The training loop: the one place where the order of a step is visible.
//   for each step: for each micro-step: batch -> forward/backward (grads add)
//                  -> clip -> AdamW at the scheduled LR -> log / eval / save

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "core/config.h"

namespace apiary::train {

struct TrainSummary {
    int64_t steps = 0;
    double final_train_loss = 0.0;
    double final_eval_loss = 0.0;
    double unigram_loss = 0.0;  // the corpus's unigram entropy, for comparison
    double tokens_per_s = 0.0;
    int64_t skipped_steps = 0;  // fp16 steps skipped for overflow
    bool interrupted = false;   // stopped by a signal before train.steps (checkpoint saved)
    std::string health_stop;    // non-empty: stopped for health.action = 'checkpoint' (why)
    double loss_scale = 1.0;
    std::string checkpoint_dir;
};

// Validates config, corpus and run directory before writing anything; then
// trains, logging to stdout and <run.dir>/metrics.jsonl, and saves a final
// checkpoint. An existing non-empty run directory is an error unless
// overwrite is set.
// world: the process group of all ranks when launched under MPI (null:
// one rank). The config's parallel.* layout must match its size.
TrainSummary run_training(const core::Config& config, bool overwrite,
                          comm::ProcessGroup* world = nullptr);

// Continues the run in config's run.dir from its latest checkpoint. The
// caller builds config from the run's own config.toml plus any overrides
// (e.g. more train.steps). The resumed run sees the same batches and ends
// with the same parameters as an uninterrupted one. The checkpoint is
// checked first; if it is damaged the error names the newest intact one,
// which previous_good resumes from instead.
TrainSummary resume_training(const core::Config& config, comm::ProcessGroup* world = nullptr,
                             bool previous_good = false);

// --auto-resume: what a requeued or restarted job does with its run.dir.
struct AutoResume {
    bool resume = false;         // continue the run
    bool previous_good = false;  // resume: fall back past a damaged `latest` or checkpoint
    bool overwrite = false;      // start anew over a run killed before its first save
};
// A run with a `latest` or a complete checkpoint continues, from the newest
// one that verifies if `latest` or its checkpoint is damaged
// (resume_training says which and why); one killed before its first save
// starts again (the run directory check still refuses a directory that is
// not an apiary run); no directory is a new run.
AutoResume auto_resume_policy(const std::string& run_dir);

}  // namespace apiary::train
