#pragma once
// Data parallelism applied from outside the single-device model (as in
// torchtitan): gradients all-reduced in buckets that start as soon as
// backward has finished them, overlapping the rest of backward; nothing is
// communicated on non-final gradient-accumulation micro-steps. ZeRO stage 1
// additionally shards the optimizer state: each rank updates its 1/N of the
// flat parameters and an all-gather puts the whole model back on every rank.

#include <cstdint>
#include <memory>

#include "comm/bucketed.h"
#include "comm/process_group.h"
#include "core/tensor.h"
#include "model/model.h"

namespace apiary::parallel {

class DataParallel {
public:
    // The model must have been built with flat_multiple = shard_multiple(dp
    // size) so that its flat buffers split into equal shards.
    // bf16_wire: buckets are rounded to bf16 for the all-reduce (half the
    // bytes; the backends sum bf16 in fp32 and round once) and widened back.
    DataParallel(comm::ProcessGroup& dp, model::Transformer& model, double bucket_mb,
                 int zero_stage, bool bf16_wire = false);
    ~DataParallel();

    static int64_t shard_multiple(int dp_size) { return 16 * int64_t(dp_size); }

    // Call before each micro-step's forward/backward: the last micro-step of
    // an optimizer step starts the bucket all-reduces from inside backward.
    void begin_micro_step(bool last);
    // After the last micro-step's backward: waits for every bucket. The
    // gradients are then the mean over data-parallel ranks on every rank.
    void finish_gradients();
    // After the optimizer updated this rank's shard (ZeRO-1): gathers the
    // parameters. A no-op at stage 0, where every rank updated everything.
    void gather_parameters();

    // The window of the flat buffers this rank's optimizer owns.
    int64_t shard_begin() const { return shard_begin_; }
    int64_t shard_end() const { return shard_end_; }
    // Concatenates every rank's shard (shard_end - shard_begin floats) into
    // full (flat size) on every rank: optimizer state for checkpoints.
    void gather_shards(const float* shard, float* full);
    // Sums over ranks, reduced in f32 (losses, counts, flags): one call for
    // all the step's scalars.
    void sum(float* values, int64_t n);
    double sum(double v);
    int zero_stage() const { return zero_stage_; }
    int size() const { return dp_.size(); }
    int rank() const { return dp_.rank(); }
    // Seconds the last finish_gradients() waited: communication not hidden
    // behind backward.
    double exposed_seconds() const { return bf16_wire_ ? exposed_s_ : buckets_->exposed_seconds(); }
    int num_buckets() const { return buckets_->num_buckets(); }

private:
    void on_grads_final(int64_t final_from);

    comm::ProcessGroup& dp_;
    model::Transformer& model_;
    int zero_stage_;
    std::unique_ptr<comm::BucketedAllReduce> buckets_;
    // bf16 wire: a staging copy of the gradients and one call per bucket.
    bool bf16_wire_ = false;
    core::Tensor staging_;
    std::vector<comm::WorkHandle> bf16_works_;
    double exposed_s_ = 0;
    void start_bucket(int i);
    int next_bucket_ = -1;  // highest bucket not yet started, -1: none left
    int64_t shard_begin_ = 0, shard_end_ = 0;
};

}  // namespace apiary::parallel
