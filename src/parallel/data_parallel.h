#pragma once
// Data parallelism applied from outside the single-device model (as in
// torchtitan), with ZeRO stages 0-3 over the model's flat buffers.
//
//   stage 0  DDP: gradients all-reduced in buckets (comm.bucket_mb) that start
//            as soon as backward has finished them, overlapping the rest of
//            backward; nothing is communicated on non-final micro-steps.
//   stage 1  The optimizer state is sharded. Rank r owns the r-th equal
//            piece of every unit (model::Unit: embeddings, each block, the
//            final norm/head); AdamW's m and v hold its pieces packed back to
//            back. On the last micro-step each unit's gradients are
//            reduce-scattered in place as soon as backward completes the
//            unit; the rank updates its pieces of the parameters, and an
//            all-gather per unit puts the whole model back on every rank.
//   stage 2  As 1, and there is no full gradient buffer: the model writes
//            each unit's gradients into a buffer lent for that unit, which
//            is reduce-scattered and added into a packed gradient shard when
//            backward is done with it, on every micro-step.
//   stage 3  As 2, and there is no full parameter buffer either: packed
//            master parameters; each unit is all-gathered just before the
//            model uses it, the next unit prefetched, and released after (two
//            block buffers; the embedding and final units stay for the pass).
//            A bf16 model gets each lent unit rounded to bf16 once per gather.
//
// Model-state bytes per rank (fp32, P = padded parameter count, N ranks,
// W = the floats of one set of lent buffers: embedding, final, two blocks):
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

class DataParallel : public model::UnitStore {
public:
    // The model must have been built with flat_multiple = shard_multiple(dp
    // size) and storage = storage_for(zero_stage).
    // bf16_wire: gradients cross the wire in bf16 (half the bytes; the
    // backends sum bf16 in fp32 and round once) and are widened back.
    DataParallel(comm::ProcessGroup& dp, model::Transformer& model, double bucket_mb,
                 int zero_stage, bool bf16_wire = false);
    ~DataParallel() override;

    static int64_t shard_multiple(int dp_size) { return 16 * int64_t(dp_size); }
    static model::Storage storage_for(int zero_stage);
    // Throws ConfigError for a stage outside 0-3.
    static void check_stage(int zero_stage);

    // The optimizer's view: stage 0 the whole flat buffers; stages 1-3 this
    // rank's packed shard (ranges() in shard coordinates).
    std::vector<optim::ParamRange> optimizer_ranges() const;
    int64_t optimizer_size() const;
    float* optimizer_params();
    float* optimizer_grads();

    // At the start of each optimizer step (zeroes the gradients).
    void zero_grads();
    // Call before each micro-step's forward/backward: the last micro-step of
    // an optimizer step starts the reductions from inside backward.
    void begin_micro_step(bool last);
    // After the last micro-step's backward: waits for every reduction. The
    // optimizer gradients are then the mean over data-parallel ranks.
    void finish_gradients();
    // L2 norm of the whole (reduced) gradient, the same on every rank.
    double grad_norm(const optim::AdamW& adam);
    // After the optimizer updated optimizer_params(): stages 1-2 all-gather
    // the parameters into the model; stage 3 drops the stale gathered units.
    void gather_parameters();

    // Stages 1-3: copies this rank's pieces of a whole flat buffer (params,
    // or m / v) into a packed shard, and back: gather_full concatenates
    // every rank's pieces into `full` on every rank (collective).
    void pack(const float* full, float* packed) const;
    void gather_full(const float* packed, float* full);
    // Sets the master parameters from a whole flat buffer (init, resume).
    void load_parameters(const float* full);

    // Sums over ranks, reduced in f32 (losses, counts, flags): one call for
    // all the step's scalars.
    void sum(float* values, int64_t n);
    double sum(double v);
    int zero_stage() const { return zero_stage_; }
    int size() const { return dp_.size(); }
    int rank() const { return dp_.rank(); }
    // Seconds the last step waited on communication (not hidden behind
    // compute): the gradient reductions plus, at stage 3, parameter gathers.
    double exposed_seconds() const;
    int num_buckets() const;

    // Model-state bytes per rank that stage `zero_stage` needs for `model`
    // (params, grads, optimizer categories of the allocator).
    static int64_t model_state_formula(const model::Transformer& model, int zero_stage,
                                       int dp_size);

    // model::UnitStore (stages 2-3).
    const float* acquire_params(int u, int next) override;
    const uint16_t* params_bf16(int u) override;
    void release_params(int u) override;
    float* acquire_grads(int u) override;
    void release_grads(int u) override;

private:
    struct Piece {
        int64_t begin = 0;   // flat offset of this rank's piece of the unit
        int64_t count = 0;   // unit size / N
        int64_t packed = 0;  // its offset in the packed shard
    };
    // An in-flight reduce-scatter of one unit's gradients into the shard.
    struct Reduce {
        int unit = -1;
        comm::WorkHandle work;
        void* recv = nullptr;  // f32 or bf16 piece, added into the shard when done
    };
    // A lent unit buffer (stages 2-3).
    struct Slot {
        core::Tensor buf;            // f32, unit-sized
        core::Tensor half;           // params of a bf16 model: buf rounded to bf16
        bool half_valid = false;
        core::Tensor wire;           // bf16 copy for the wire (grads, bf16_wire)
        core::Tensor recv;           // the piece that comes back (grads)
        int unit = -1;               // what buf holds (or is being gathered)
        bool valid = false;          // params: gathered and current
        bool lent = false;
        comm::WorkHandle work;       // params: the gather; grads: the reduce
    };

    void on_grads_final(int64_t final_from);
    void start_bucket(int i);
    void start_reduce(int u, const float* src, uint16_t* wire, void* recv, bool add);
    void complete(Reduce& r);
    void complete_slot(Slot& s);
    Slot& param_slot_for(int u);
    Slot* grad_slot_for(int u);
    void start_gather(Slot& s, int u);
    double wait_timed(const comm::WorkHandle& w);
    bool is_block(int u) const { return u >= 1 && u <= int(units_.size()) - 2; }

    comm::ProcessGroup& dp_;
    model::Transformer& model_;
    int zero_stage_;
    bool bf16_wire_ = false;
    std::vector<model::Unit> units_;

    // Stage 0.
    std::unique_ptr<comm::BucketedAllReduce> buckets_;
    core::Tensor staging_;  // bf16 wire: the gradients in bf16 (stages 0-1)
    std::vector<comm::WorkHandle> bf16_works_;
    void start_bucket_bf16(int i);
    int next_bucket_ = -1;  // highest bucket not yet started, -1: none left

    // Stages 1-3.
    std::vector<Piece> pieces_;
    int64_t packed_size_ = 0;
    core::Tensor master_;      // stage 3: this rank's pieces of the parameters
    core::Tensor grad_shard_;  // stages 2-3: its pieces of the mean gradients
    core::Tensor recv16_;           // stage 1 + bf16 wire: the reduced pieces in bf16
    std::vector<Reduce> reduces_;   // stage 1: one per unit
    int next_unit_ = -1;            // stage 1: highest unit not yet reduced
    std::vector<Slot> pslots_;      // stage 3: embedding, final, two blocks
    std::vector<Slot> gslots_;      // stages 2-3: embedding, final, two blocks
    int next_gblock_ = 0;           // round robin over the two block grad slots
    int next_pblock_ = 0;

    double exposed_s_ = 0;
};

}  // namespace apiary::parallel
