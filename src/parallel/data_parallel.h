#pragma once
// Data parallelism as one part of the engine, always present: where this
// rank's parameters, gradients and optimizer state live (whole, or its
// ZeRO pieces), how gradients are reduced over the data-parallel group, the
// optimizer step on what this rank owns, and which slices of that state it
// saves and loads in a checkpoint. With one data-parallel rank the group is a
// comm::SelfGroup and the reduction a LocalSync that does nothing: the
// engine's step calls the same functions for every layout.
//
// The ZeRO stages themselves (what is sharded, how the reductions run) are in
// parallel/zero.h; this class chooses and composes them, so that nothing
// outside it does ZeRO-stage arithmetic.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "model/model.h"
#include "optim/adamw.h"
#include "parallel/zero.h"

namespace apiary::parallel {

// The three kinds of per-parameter state a checkpoint holds, by their names
// in it.
enum class StateKind { param, adam_m, adam_v };
inline constexpr StateKind kStateKinds[3] = {StateKind::param, StateKind::adam_m,
                                             StateKind::adam_v};
const char* state_name(StateKind kind);

struct DataParallelOptions {
    int zero_stage = 0;   // forced to 0 for one data-parallel rank
    double bucket_mb = 25.0;
    bool bf16_wire = false;
    optim::AdamWOptions adamw;
    // Global tensor names starting with any of these are not trained.
    std::vector<std::string> freeze;
    // This rank's tensor-parallel rank: tensors every tensor-parallel rank
    // holds whole count in the gradient norm on rank 0 only.
    int tp_rank = 0;
    // Expert parallelism: the group that replicates this rank's experts.
    ExpertGroups experts;
};

// A range [begin, end) of flat offsets of the model shard.
struct FlatRange {
    int64_t begin = 0, end = 0;
};

class DataParallel {
  public:
    // before_reduce(u, grads): run on a unit's gradients just before their
    // reduction at stages 2-3 (the engine sums sequence-parallel gradients
    // over the tensor-parallel ranks there).
    DataParallel(comm::ProcessGroup& group, model::Transformer& model,
                 const DataParallelOptions& options,
                 std::function<void(int, float*)> before_reduce);
    DataParallel(const DataParallel&) = delete;
    DataParallel& operator=(const DataParallel&) = delete;

    int size() const { return group_.size(); }
    int zero_stage() const { return zero_; }
    comm::ProcessGroup& group() { return group_; }
    GradSync& sync() { return *sync_; }
    const GradSync& sync() const { return *sync_; }
    optim::AdamW& optimizer() { return *adam_; }
    const optim::AdamW& optimizer() const { return *adam_; }

    // Fresh parameters from a seed (stage 3 keeps only its pieces).
    void init(uint64_t seed);
    // Before a step: reduction counters reset, gradients zeroed.
    void begin_step();
    // The gradients the optimizer reads: the model's, or the packed shard.
    const float* grads() const;
    // This rank's part of the global gradient norm, squared.
    double local_grad_norm_squared() const;
    // The update of what this rank owns (raw_norm: the global norm before
    // the loss scale is removed), then the parameters made whole again where
    // the stage keeps them whole.
    void step(float lr, float inv_scale, double raw_norm);
    // After the parameters or optimizer state were written directly
    // (checkpoint load): drops copies made from the old values.
    void state_loaded();
    // Seconds a step's gradient reduction takes with nothing to overlap
    // (stages 0-1 over more than one rank; 0 otherwise). Collective.
    double reduction_alone_seconds();

    // ---- checkpoint slices ----
    // The flat ranges this rank saves: its piece of every unit, so that the
    // data-parallel ranks write disjoint parts in parallel.
    const std::vector<FlatRange>& saved_ranges() const { return saved_; }
    // Whether this rank holds `kind` for the whole shard (it then loads
    // all of it) or only for its saved ranges.
    bool holds_whole(StateKind kind) const;
    // Where flat offset `flat` of `kind` lives on this rank; `flat` must be
    // in the saved ranges unless holds_whole(kind).
    // The writable form (for loading) marks the model's low-precision
    // weight copy stale; the const one (for saving) does not.
    float* state_at(StateKind kind, int64_t flat);
    const float* state_at(StateKind kind, int64_t flat) const;

  private:
    void build_optimizer(const DataParallelOptions& o);
    int64_t packed_offset(int64_t flat) const;

    comm::ProcessGroup& group_;
    model::Transformer& model_;
    ExpertGroups experts_;
    int zero_ = 0;
    std::unique_ptr<DpShards> shards_;  // stages 1-3
    std::unique_ptr<GradSync> sync_;
    ShardedStore* store_ = nullptr;     // sync_ at stages 2-3
    std::unique_ptr<optim::AdamW> adam_;
    std::vector<FlatRange> saved_;
    std::vector<int64_t> saved_packed_;  // packed offset of each saved range
};

}  // namespace apiary::parallel
