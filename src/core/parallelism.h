#pragma once
// The words that the trainer (parallel/), the planner (plan/) and the
// simulator (sim/) share for a parallel layout, defined once: the pipeline
// schedule, what backward recomputes, and the order of the parallel axes
// over the ranks.

#include <string>

namespace apiary::core {

// The order in which the micro-batches of a step pass through the pipeline
// stages (parallel/schedule.h builds the operations of each).
//   gpipe        all forwards, then all backwards
//   one_f_one_b  PipeDream-Flush ("1f1b"): warm-up forwards, then one
//                forward and one backward in turn
//   interleaved  Megatron-LM's interleaved 1F1B over several model chunks
//                (virtual stages) per stage
enum class PipelineSchedule { gpipe, one_f_one_b, interleaved };
PipelineSchedule parse_pipeline_schedule(const std::string& name);  // throws ConfigError
const char* pipeline_schedule_name(PipelineSchedule s);  // "gpipe", "1f1b", "interleaved"

// What backward recomputes instead of keeping from forward.
//   none:      every activation is kept per micro-batch in flight.
//   selective: the attention core (its output and log-sum-exp) is recomputed
//              from the kept q, k, v (Korthikanti et al. 2022).
//   full:      only each block's input is kept; the block's forward runs
//              again just before its backward.
enum class Recompute { none, selective, full };
Recompute parse_recompute(const std::string& name);  // throws ConfigError
const char* recompute_name(Recompute r);

// The rank order: world ranks enumerate the parallel axes tp, cp, dp, pp,
// tp fastest (Megatron-Core's "tp-cp-ep-dp-pp"; torchtitan's mesh has the
// same order). A tensor-parallel group is on neighbouring ranks, one node,
// where its per-layer traffic belongs; data parallelism (whose traffic
// overlaps backward) comes next, the pipeline's few point-to-point messages
// span the most distance. The trainer's mesh uses it unless
// parallel.axis_order says otherwise (it has no cp axis: tp, dp, pp); the
// planner and the simulator always use it.
inline constexpr const char* kAxisOrder = "tp,dp,pp";

}  // namespace apiary::core
