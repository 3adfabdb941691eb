#pragma once
// Data-parallel gradient buckets over one flat f32 gradient buffer: the
// caller (parallel::AllReduceSync, from the model's gradient hook) marks a
// bucket ready as soon as backward has written its last gradient; its
// all-reduce starts at once (non-blocking) and overlaps the rest of
// backward; finish() waits for all of them before the optimizer step.
//
// Every rank must mark buckets in the same order (backward order is
// deterministic, so this holds). On gradient-accumulation micro-steps
// before the last, nothing is marked.

#include <chrono>
#include <cstdint>
#include <vector>

#include "comm/process_group.h"

namespace apiary::comm {

struct BucketRange {
    int64_t offset = 0;  // first element in the flat buffer
    int64_t count = 0;   // elements
};

// Splits [0, numel) into consecutive buckets of about bucket_bytes of f32,
// never splitting one of the parameters (given by their sizes, in flat-buffer
// order, summing to numel); a parameter larger than a bucket gets its own.
std::vector<BucketRange> make_buckets(const std::vector<int64_t>& param_numels,
                                      size_t bucket_bytes);

class BucketedAllReduce {
  public:
    // grads (numel) must outlive this object; op is usually avg (mean gradient).
    BucketedAllReduce(ProcessGroup& group, float* grads, std::vector<BucketRange> buckets,
                      ReduceOp op = ReduceOp::avg);
    ~BucketedAllReduce();

    int num_buckets() const { return int(buckets_.size()); }
    const BucketRange& bucket(int i) const { return buckets_[size_t(i)]; }

    // Starts bucket i's all-reduce now. Each bucket at most once per step.
    void mark_ready(int i);
    // Waits for every started bucket; every bucket must have been marked.
    // Then the next step may begin.
    void finish();
    // Seconds finish() spent blocked in the last step: communication that
    // was not hidden behind compute.
    double exposed_seconds() const { return exposed_s_; }

  private:
    ProcessGroup& group_;
    float* grads_;
    std::vector<BucketRange> buckets_;
    ReduceOp op_;
    std::vector<WorkHandle> works_;
    double exposed_s_ = 0;
};

}  // namespace apiary::comm
