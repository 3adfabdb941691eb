#pragma once
// The parallel layout of a training run: how the world splits into data,
// tensor and pipeline ranks, how the blocks split into (virtual) pipeline
// stages, and what each rank's model shard is. Built from the parallel.*
// keys, the model and the batch, and checked completely before any rank
// allocates: every error names the numbers and what would work.

#include <cstdint>
#include <string>
#include <vector>

#include "comm/mesh.h"
#include "core/config.h"
#include "core/model_spec.h"
#include "core/stage_split.h"
#include "model/layout.h"
#include "parallel/schedule.h"

namespace apiary::parallel {

struct ParallelLayout {
    comm::MeshShape mesh;
    // Expert parallelism: ep consecutive dp ranks share out the routed
    // experts of every MoE block (parallel/zero.h, ExpertGroups).
    int ep = 1;
    int zero_stage = 0;
    bool sequence_parallel = false;
    core::Recompute recompute = core::Recompute::none;
    PipelineSchedule schedule = PipelineSchedule::one_f_one_b;
    int virtual_stages = 1;  // chunks per pipeline stage
    int microbatches = 1;    // per optimizer step (train.grad_accum)
    // Blocks of each virtual stage j = chunk * pp + stage, in order.
    std::vector<std::vector<int>> stage_blocks;

    int tp() const { return mesh.tp; }
    int pp() const { return mesh.pp; }
    int dp() const { return mesh.dp; }
    // One line: "dp 2 x tp 2 x pp 2, 1f1b, 8 micro-batches, stages 3+3+2+4".
    std::string describe() const;
    // The model shard of the rank at `coord` (slots filled in by the engine).
    model::ModelShard shard(const comm::MeshCoord& coord) const;
};

// Throws ConfigError on any inconsistency. The micro-batch
// (train.batch_size, train.seq_len) and the shapes a sequence-length
// curriculum passes through are checked too.
ParallelLayout parallel_layout_from(const core::Config& config, const core::ModelSpec& spec,
                                    int world_size);

// The layout of one rank: the whole model, no sharding.
ParallelLayout one_rank_layout(const core::ModelSpec& spec, int microbatches = 1);

// The default split of blocks over stages (core/stage_split.h).
using core::balanced_stage_layers;

}  // namespace apiary::parallel
