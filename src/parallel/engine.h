#pragma once
// The parallel plan applied: one rank's model shard, wrapped from outside in
// one visible order (as torchtitan applies its parallelisms):
//
//   1. tensor parallelism: the shard holds whole heads, a slice of the MLP
//      width and of the vocabulary; the model calls TpComm where partial
//      results meet (model/tp_comm.h)
//   2. pipeline parallelism: the shard holds a chunk of blocks per virtual
//      stage; the schedule (parallel/schedule.h) runs micro-batches through
//      them, activations and their gradients sent point to point
//   3. data parallelism with ZeRO 0-3 (parallel/zero.h) over the shard's
//      flat buffers; the optimizer updates this rank's part
//
// One code path for every layout, a single rank included: every part is
// always present, of size 1 where the layout does not split that way (the
// world of one rank is a comm::SelfGroup, tensor-parallel collectives over
// one rank do nothing, data parallelism over one rank a LocalSync), so the
// step never asks whether a part exists. The step itself is train_step(),
// which the trainer and every benchmark call.

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "comm/mesh.h"
#include "comm/process_group.h"
#include "core/model_spec.h"
#include "core/tensor.h"
#include "model/model.h"
#include "optim/adamw.h"
#include "optim/loss_scaler.h"
#include "parallel/data_parallel.h"
#include "parallel/layout.h"
#include "parallel/schedule.h"
#include "parallel/tp_comm.h"
#include "parallel/zero.h"

namespace apiary::parallel {

struct EngineOptions {
    model::Precision precision = model::Precision::fp32;
    optim::AdamWOptions adamw;
    optim::LossScalerOptions loss_scaler;  // used when precision is fp16
    double bucket_mb = 25.0;
    bool bf16_wire = false;  // gradients cross the data-parallel wire in bf16
    // Stages 0-1 start each bucket's reduction from inside backward as it
    // completes; false defers them all until after backward (to compare
    // against; stages 2-3 reduce each lent unit as it is released either way).
    bool overlap_reduction = true;
    // Global tensor names starting with any of these are not trained.
    std::vector<std::string> freeze;
};

// What one optimizer step did, the same on every rank.
struct StepResult {
    double loss_sum = 0;   // over the global batch (nats)
    int64_t count = 0;     // tokens counted in it
    double grad_norm = 0;  // global L2 norm before clipping, loss scale removed
    bool applied = true;   // false: skipped (fp16 overflow)
    bool stop = false;     // some rank asked to stop after this step
    // With set_rank_signals(): the largest health level of any rank, and the
    // busiest and least busy rank's busy seconds (all ranks' previous step).
    int health = 0;
    double busy_max_s = 0, busy_min_s = 0;
    double loss() const { return count ? loss_sum / double(count) : 0.0; }
};

// Where this rank's time in the last step went (seconds).
struct StepTimes {
    double total = 0;
    double compute = 0;     // forward and backward ops (communication inside them counted apart)
    double tp_comm = 0;     // tensor-parallel collectives (inside forward / backward)
    double pp_wait = 0;     // waiting for a pipeline neighbour's message
    double ep_comm = 0;     // expert-parallel all-to-alls (inside forward / backward)
    double dp_exposed = 0;  // data-parallel communication not hidden behind backward
    double optimizer = 0;   // norm, scaler, AdamW, parameter gather
    // compute split into forward and backward ops (the head's loss and
    // backward count as backward); tensor-parallel waits left out.
    double forward = 0, backward = 0;
    // Mean seconds of one forward / backward op (a chunk on a micro-batch):
    // the per-stage timings a schedule replay takes (schedule.h).
    double forward_op = 0, backward_op = 0;
    int forward_ops = 0, backward_ops = 0;
    double bubble() const { return total > 0 ? pp_wait / total : 0.0; }
};

class Engine {
  public:
    // world: all ranks (null: one rank). Collective: every rank constructs
    // its engine with the same arguments. max_B, max_T: the largest
    // micro-batch (rows and sequence length per data-parallel rank).
    Engine(const core::ModelSpec& spec, const ParallelLayout& layout, comm::ProcessGroup* world,
           int64_t max_B, int64_t max_T, const EngineOptions& options);
    ~Engine();
    Engine(const Engine&) = delete;
    Engine& operator=(const Engine&) = delete;

    // ---- the step ----
    // One optimizer step on this data-parallel rank's rows of the step: rows
    // (B * microbatches) of T + 1 tokens each (inputs, and targets shifted by
    // one). lr: this step's learning rate. stop: this rank asks to stop
    // after the step (a signal); the result says whether any rank did.
    // poison: a testing hook, the loss scale of this rank's last micro-step
    // becomes infinite.
    StepResult train_step(const int32_t* rows, int64_t n_rows, int64_t T, double lr, bool stop,
                          bool poison = false);
    // Forward only over this rank's rows (rows of T + 1 tokens); the summed
    // loss over all data-parallel ranks (collective).
    model::LossResult evaluate(const int32_t* rows, int64_t n_rows, int64_t T);
    const StepTimes& times() const { return times_; }
    // What this rank tells the others with the next step's scalars (one
    // more 24-byte all-reduce per step, from the first call on): its health
    // level (0: fine) and its busy seconds (time not spent waiting on
    // peers). Every rank calls it before every step or none does.
    void set_rank_signals(int health, double busy_s) {
        signals_[0] = double(health);
        signals_[1] = busy_s;
        signals_[2] = -busy_s;
        exchange_signals_ = true;
    }

    // ---- state ----
    void init(uint64_t seed);
    model::Transformer& model() { return *model_; }
    const model::Transformer& model() const { return *model_; }
    const ParallelLayout& layout() const { return layout_; }
    const comm::MeshCoord& coord() const { return coord_; }
    optim::AdamW& optimizer() { return dp_->optimizer(); }
    optim::LossScaler& loss_scaler() { return scaler_; }
    const optim::LossScaler& loss_scaler() const { return scaler_; }
    int zero_stage() const { return layout_.zero_stage; }
    // Where this rank's parameters, gradients and optimizer state live, and
    // which checkpoint slices it holds.
    DataParallel& data_parallel() { return *dp_; }
    const DataParallel& data_parallel() const { return *dp_; }
    // After the state was written directly (data_parallel().state_at):
    // drops whatever was gathered or cast from the old values.
    void params_loaded() { dp_->state_loaded(); }
    // Process groups, for callers that reduce their own values (of one rank
    // in a one-rank run).
    comm::ProcessGroup& world() { return *world_; }
    comm::ProcessGroup& dp_group() { return mesh_->dp(); }
    // Sum over every rank of the world (one all-reduce each).
    double sum_over_world(double v);
    int64_t sum_over_world(int64_t v);
    // The rank that speaks for the run (logs, metrics): world rank 0.
    bool main_rank() const { return world_->rank() == 0; }
    int world_size() const { return world_->size(); }
    int world_rank() const { return world_->rank(); }
    // Bytes this rank sent or received per step, by kind (last step).
    double tp_bytes() const { return tp_->bytes(); }
    double ep_bytes() const { return ep_->bytes(); }
    double pp_bytes() const { return pp_bytes_; }
    double exposed_comm_seconds() const {
        return times_.dp_exposed + times_.tp_comm + times_.ep_comm + times_.pp_wait;
    }
    int num_buckets() const { return dp_->sync().num_buckets(); }
    // The last step's data-parallel reductions, and those started inside
    // the model's backward (overlapping it; GradSync counts them).
    int dp_reductions() const { return dp_->sync().reductions(); }
    int dp_reductions_in_backward() const { return dp_->sync().reductions_in_backward(); }
    // Seconds the data-parallel gradient reduction of a step takes with
    // nothing to overlap (stages 0-1; 0 otherwise): all of it started at
    // once and waited for. Collective; for benchmarks.
    double reduction_alone_seconds() { return dp_->reduction_alone_seconds(); }

  private:
    struct Pending {
        comm::WorkHandle work;
        core::Tensor buf;
    };
    void run_schedule(const int32_t* rows, int64_t B, int64_t T, float grad_scale, bool poison,
                      model::LossResult& local);
    void forward_op(const PipeOp& op, const int32_t* rows, int64_t B, int64_t T);
    void backward_op(const PipeOp& op, const int32_t* rows, int64_t B, int64_t T, float grad_scale,
                     model::LossResult& local);
    // Micro-batch i of `rows`: inputs and targets (B, T).
    void unpack(const int32_t* rows, int micro, int64_t B, int64_t T);
    void send(const float* data, int64_t n, int dst, int tag);
    void recv(float* data, int64_t n, int src, int tag);
    void reap_sends(bool all);
    void on_grads_ready(int64_t final_from);
    void reduce_tp_partial(int unit, float* unit_grads);
    void finish_grads();
    double global_grad_norm();
    bool loss_contributor() const;

    core::ModelSpec spec_;
    ParallelLayout layout_;
    std::shared_ptr<comm::ProcessGroup> self_;  // the world of a one-rank run
    comm::ProcessGroup* world_;                 // never null
    std::unique_ptr<comm::DeviceMesh> mesh_;
    comm::MeshCoord coord_;
    std::shared_ptr<comm::ProcessGroup> tied_group_;  // first and last stage (tied embeddings)
    std::unique_ptr<TpComm> tp_;
    // Expert parallelism: the ep group (token all-to-alls) and the edp group
    // (the ranks that hold the same experts); null without it.
    std::shared_ptr<comm::ProcessGroup> ep_group_, edp_group_;
    std::unique_ptr<EpComm> ep_;
    std::unique_ptr<model::Transformer> model_;
    std::unique_ptr<DataParallel> dp_;
    optim::LossScaler scaler_;
    // The pipeline.
    std::vector<PipeOp> ops_;
    std::vector<std::vector<int>> free_slots_;  // per chunk
    std::vector<std::vector<int>> slot_of_;     // per chunk, per micro-batch
    std::vector<int32_t> tokens_, targets_;     // one micro-batch (B, T)
    core::Tensor io_;                           // a received activation or gradient
    std::deque<Pending> sends_;
    std::vector<core::Tensor> spare_;  // send buffers to reuse
    int64_t max_rows_ = 0;
    std::vector<bool> tp_fixed_;  // per unit: sequence-parallel gradients summed this step
    bool has_tied_ = false;
    int tied_entry_ = -1;  // the registry entry summed with the other end of the pipeline
    StepTimes times_;
    double pp_bytes_ = 0;
    double signals_[3] = {0, 0, 0};  // health, busy, -busy: one max all-reduce
    bool exchange_signals_ = false;
    bool overlap_reduction_ = true;
};

}  // namespace apiary::parallel
