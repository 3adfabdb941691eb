#pragma once
// Data parallelism over one model shard's flat buffers, in small parts that
// DataParallel (parallel/data_parallel.h) composes by ZeRO stage:
//
//   stage 0  AllReduceSync: gradients all-reduced in buckets (comm.bucket_mb)
//            started as soon as backward has finished them, overlapping the
//            rest of backward; nothing is communicated on earlier micro-steps.
//   stage 1  DpShards + ReduceScatterSync: rank r owns the r-th equal piece
//            of every unit (model::Unit); AdamW's m and v hold its pieces
//            packed back to back. On the last micro-step each unit's
//            gradients are reduce-scattered in place as backward completes
//            the unit; after the update an all-gather per unit puts the whole
//            model back on every rank.
//   stage 2  DpShards + ShardedStore: no full gradient buffer; the model
//            writes each unit's gradients into a buffer lent for that unit,
//            reduce-scattered into a packed gradient shard when backward is
//            done with it, on every micro-step.
//   stage 3  As 2, and no full parameter buffer either: packed master
//            parameters; each unit is all-gathered just before the model uses
//            it, the next unit prefetched, and released after (two block
//            buffers; the embedding and final units stay for the step). A
//            bf16 model gets each lent unit rounded to bf16 once per gather.
//
// Model-state bytes per rank (fp32, P = padded parameters of the shard, N
// ranks, W = the floats of one set of lent buffers: embedding, final, two
// blocks):
//   stage 0: 16 P              (params 4P, grads 4P, m+v 8P)
//   stage 1:  8 P +  8 P / N   (m+v 8P/N)
//   stage 2:  4 P + 12 P / N + 4 W   (grad shard 4P/N, lent grads)
//   stage 3:       16 P / N + 8 W   (master 4P/N, lent params and grads)
//   (bf16 models add their 2P weight copy at stages 0-2, 2W at stage 3.)
// model_state_formula() computes them; the tests hold the allocator's
// accounting to it.

#include <cstdint>
#include <memory>
#include <vector>

#include "comm/bucketed.h"
#include "comm/process_group.h"
#include "core/tensor.h"
#include "model/model.h"
#include "optim/adamw.h"

namespace apiary::parallel {

// Units are padded to multiples of this, so each splits into aligned pieces.
inline int64_t shard_multiple(int dp_size) { return 16 * int64_t(dp_size); }
model::Storage storage_for(int zero_stage);
void check_zero_stage(int zero_stage);  // throws ConfigError outside 0-3
// params + grads + optimizer bytes per rank that `zero_stage` needs.
int64_t model_state_formula(const model::Transformer& model, int zero_stage, int dp_size);

// Expert parallelism (ep > 1) carves ep out of the dp ranks: dp ranks
// g ep .. g ep + ep - 1 form an ep group (they exchange tokens), and the
// dp / ep ranks with the same dp_rank % ep (the edp group) hold the same
// routed experts. The experts' units (model::Unit::expert) are reduced and
// sharded over the edp group only; every other unit over all dp ranks.
struct ExpertGroups {
    comm::ProcessGroup* edp = nullptr;  // null: no expert parallelism
    int ep = 1;
};

// This rank's piece of every unit (stages 1-3): of an expert unit, its
// piece over the edp group.
class DpShards {
  public:
    struct Piece {
        int64_t begin = 0;   // flat offset of this rank's piece of the unit
        int64_t count = 0;   // unit size / N
        int64_t packed = 0;  // its offset in the packed shard
    };
    DpShards(comm::ProcessGroup& dp, const model::Transformer& model, ExpertGroups experts = {});
    // The group unit u is reduced and sharded over.
    comm::ProcessGroup& group_of(int u) const;
    const std::vector<Piece>& pieces() const { return pieces_; }
    int64_t packed_size() const { return packed_size_; }
    // This rank's pieces of a whole flat buffer into a packed shard.
    void pack(const float* full, float* packed) const;
    // Every rank's updated pieces of `flat` into everyone's (in place).
    void all_gather_in_place(float* flat);

  private:
    comm::ProcessGroup& dp_;
    ExpertGroups experts_;
    std::vector<model::Unit> units_;
    std::vector<Piece> pieces_;
    int64_t packed_size_ = 0;
};

// The expert units' gradient reductions (ep > 1, stages 0-1), started by
// the dp sync alongside its own: each expert unit is scaled by 1 / ep (a
// replica's gradient covers the tokens of its ep group's ranks; the mean is
// over all dp ranks), then all-reduced (stage 0) or reduce-scattered in
// place (stage 1) as the mean over the edp group. Always f32 on the wire.
class ExpertReductions {
  public:
    ExpertReductions(ExpertGroups experts, model::Transformer& model, const DpShards* shards);
    ~ExpertReductions();
    // Starts the expert units at offsets >= final_from not yet started;
    // returns how many it started.
    int on_ready(int64_t final_from);
    // Waits for all of them; the seconds it waited.
    double finish();
    void reset() { next_ = int(units_.size()) - 1; }

  private:
    ExpertGroups experts_;
    model::Transformer& model_;
    const DpShards* shards_;  // stage 1; null at stage 0
    std::vector<model::Unit> units_;
    std::vector<comm::WorkHandle> works_;  // per unit
    int next_ = -1;
};

// Gradient reduction over the data-parallel ranks (stages 0-1; stages 2-3
// reduce from the ShardedStore). The engine forwards the model's
// grad-ready reports of the last micro-step to on_ready().
class GradSync {
  public:
    virtual ~GradSync() = default;
    // Called on the last micro-step as backward completes the gradients of
    // every parameter at flat offset >= final_from; starts their reduction.
    virtual void on_ready(int64_t final_from) = 0;
    // Starts what is left, waits for everything: the gradients are then the
    // mean over the data-parallel ranks (stage 1: this rank's pieces).
    virtual void finish() = 0;
    // Seconds finish() and on_ready() waited: communication not hidden.
    virtual double exposed_seconds() const = 0;
    virtual void reset() = 0;
    virtual int num_buckets() const = 0;
    // Reductions of the last step, and how many of them started while the
    // engine ran the model's backward (from its gradient hook or, at stages
    // 2-3, as it released a unit's gradients): overlapping it. Those the
    // engine starts afterwards (finish() and what precedes it) do not count.
    int reductions() const { return started_; }
    int reductions_in_backward() const { return started_in_backward_; }
    // The engine marks the span of the model's backward calls.
    void set_in_backward(bool in) { in_backward_ = in; }

  protected:
    // Every reduction start goes through here.
    void count_start() {
        ++started_;
        if (in_backward_) ++started_in_backward_;
    }
    void reset_counts() {
        started_ = started_in_backward_ = 0;
        in_backward_ = false;
    }

  private:
    int started_ = 0, started_in_backward_ = 0;
    bool in_backward_ = false;
};

// One data-parallel rank: its gradients are already the mean, nothing to
// reduce.
class LocalSync : public GradSync {
  public:
    void on_ready(int64_t) override {}
    void finish() override {}
    double exposed_seconds() const override { return 0.0; }
    void reset() override { reset_counts(); }
    int num_buckets() const override { return 0; }
};

// Stage 0: bucketed all-reduce, optionally bf16 on the wire.
class AllReduceSync : public GradSync {
  public:
    AllReduceSync(comm::ProcessGroup& dp, model::Transformer& model, double bucket_mb,
                  bool bf16_wire, ExpertGroups experts = {});
    ~AllReduceSync() override;
    void on_ready(int64_t final_from) override;
    void finish() override;
    double exposed_seconds() const override;
    void reset() override;
    int num_buckets() const override { return buckets_->num_buckets(); }

  private:
    void start(int i);
    comm::ProcessGroup& dp_;
    model::Transformer& model_;
    bool bf16_wire_;
    std::unique_ptr<comm::BucketedAllReduce> buckets_;  // every unit but the experts'
    std::unique_ptr<ExpertReductions> experts_;         // ep > 1
    core::Tensor staging_;  // bf16 wire: the gradients in bf16
    std::vector<comm::WorkHandle> bf16_works_;
    int next_ = -1;  // highest bucket not yet started
    double exposed_s_ = 0;
};

// Stage 1: each unit's gradients reduce-scattered in place.
class ReduceScatterSync : public GradSync {
  public:
    ReduceScatterSync(comm::ProcessGroup& dp, model::Transformer& model, const DpShards& shards,
                      bool bf16_wire, ExpertGroups experts = {});
    ~ReduceScatterSync() override;
    void on_ready(int64_t final_from) override;
    void finish() override;
    double exposed_seconds() const override { return exposed_s_; }
    void reset() override;
    int num_buckets() const override { return int(works_.size()); }

  private:
    comm::ProcessGroup& dp_;
    model::Transformer& model_;
    const DpShards& shards_;
    bool bf16_wire_;
    std::vector<model::Unit> units_;
    std::vector<comm::WorkHandle> works_;  // per unit
    core::Tensor staging_, recv16_;        // bf16 wire
    int next_ = -1;                        // highest unit not yet started
    double exposed_s_ = 0;
    std::unique_ptr<ExpertReductions> experts_;  // ep > 1: the expert units
};

// Stages 2-3: lends the model each unit's gradient (and, at stage 3,
// parameter) buffers and reduce-scatters released gradients into a packed
// shard; also the gradient sync of those stages.
class ShardedStore : public model::UnitStore, public GradSync {
  public:
    // before_reduce(u, grads), if set, runs on a unit's lent gradients just
    // before their reduction (the engine sums sequence-parallel gradients
    // over the tensor-parallel ranks there).
    // ep > 1 (stage 2 only): expert units are scaled by 1 / ep and reduced
    // over their edp group (DpShards::group_of), like ExpertReductions.
    ShardedStore(comm::ProcessGroup& dp, model::Transformer& model, DpShards& shards,
                 int zero_stage, bool bf16_wire, int ep = 1);
    ~ShardedStore() override;
    void set_before_reduce(std::function<void(int, float*)> f) { before_reduce_ = std::move(f); }

    float* master_params() { return master_.f32(); }  // stage 3
    float* grad_shard() { return grad_shard_.f32(); }
    // Sets the master parameters from a whole flat buffer (stage 3).
    void load_parameters(const float* full);
    // After the optimizer step (stage 3): gathered units are stale.
    void invalidate_params();
    void zero_grads() { grad_shard_.zero(); }

    // model::UnitStore
    const float* acquire_params(int u, int next) override;
    const uint16_t* params_bf16(int u) override;
    void release_params(int u) override;
    float* acquire_grads(int u) override;
    void release_grads(int u) override;
    // GradSync: reductions start from release_grads on every micro-step.
    void on_ready(int64_t) override {}
    void finish() override;
    double exposed_seconds() const override { return exposed_s_; }
    void reset() override {
        exposed_s_ = 0;
        reset_counts();
    }
    int num_buckets() const override { return int(shards_.pieces().size()); }

  private:
    // A lent unit buffer.
    struct Slot {
        core::Tensor buf;   // f32, unit-sized
        core::Tensor half;  // params of a bf16 model: buf rounded to bf16
        bool half_valid = false;
        core::Tensor wire;  // bf16 copy for the wire (grads, bf16_wire)
        core::Tensor recv;  // the piece that comes back (grads)
        int unit = -1;      // what buf holds (or is being gathered)
        bool lent = false;
        comm::WorkHandle work;  // params: the gather; grads: the reduce
    };
    Slot& param_slot_for(int u);
    Slot* grad_slot_for(int u);
    void start_gather(Slot& s, int u);
    void complete_grads(Slot& s);
    double wait_timed(const comm::WorkHandle& w);

    comm::ProcessGroup& dp_;
    model::Transformer& model_;
    DpShards& shards_;
    int zero_stage_;
    bool bf16_wire_;
    int ep_ = 1;
    std::vector<model::Unit> units_;
    core::Tensor master_;                // stage 3: this rank's pieces of the parameters
    core::Tensor grad_shard_;            // its pieces of the mean gradients
    std::vector<Slot> pslots_, gslots_;  // embedding, final, two blocks
    int next_gblock_ = 0, next_pblock_ = 0;
    std::function<void(int, float*)> before_reduce_;
    double exposed_s_ = 0;
};

}  // namespace apiary::parallel
