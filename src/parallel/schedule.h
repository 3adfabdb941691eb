#pragma once
// Pipeline schedules: for one stage of p, the order in which it runs the
// forward (F) and backward (B) passes of m micro-batches over its v model
// chunks (virtual stages). Pure functions of (kind, p, stage, m, v), so that
// every rank derives the same plan and a test can check that the schedule's
// point-to-point messages pair up without a deadlock.
//
//   gpipe        all forwards, then all backwards (m micro-batches in flight)
//   1f1b         PipeDream-Flush: p - stage - 1 warm-up forwards, then one
//                forward and one backward in turn, then the remaining
//                backwards (at most p - stage in flight)
//   interleaved  Megatron-LM's interleaved 1F1B over v chunks per stage
//                (chunk c of stage s holds virtual stage c * p + s); it
//                needs m to be a multiple of p

#include <string>
#include <vector>

#include "core/parallelism.h"

namespace apiary::parallel {

using core::PipelineSchedule;  // core/parallelism.h: the kinds and their parser

struct PipeOp {
    bool forward = true;
    int chunk = 0;  // local chunk (virtual stage chunk * p + stage)
    int micro = 0;  // micro-batch
    bool operator==(const PipeOp&) const = default;
};

// The ops of `stage` in the order it runs them: every (chunk, micro) once
// forward and once backward, each chunk's forwards and backwards in micro
// order. v > 1 needs kind = interleaved.
std::vector<PipeOp> pipeline_schedule(PipelineSchedule kind, int p, int stage, int m, int v);

// Micro-batches of one chunk in flight at once (forward done, backward not
// yet) under the schedule: the activation slots the stage needs.
int slots_needed(const std::vector<PipeOp>& ops);

// Checks a whole pipeline's schedules against each other: each message
// (activations forward, gradients backward) between virtual stages is
// received in the order it is sent, and running the ranks with blocking
// receives and non-blocking sends ends. Returns "" or what goes wrong.
std::string check_schedules(PipelineSchedule kind, int p, int m, int v);
// The same for given op lists, one per stage.
std::string check_schedules(const std::vector<std::vector<PipeOp>>& ops, int v);

// Replays the schedule with each stage's forward and backward op taking
// fwd[stage] and bwd[stage] seconds (per chunk and micro-batch) and
// messages arriving at once: each stage's idle fraction of the step
// (makespan). With equal times it is ideal_bubble() on every stage.
std::vector<double> replay_idle(PipelineSchedule kind, int p, int m, int v,
                                const std::vector<double>& fwd, const std::vector<double>& bwd);

// Fraction of a step a stage idles in the ideal schedule, (p - 1) / (v m +
// p - 1) for 1F1B and GPipe with equal stage times (interleaving divides the
// bubble by v).
double ideal_bubble(int p, int m, int v);

}  // namespace apiary::parallel
