#pragma once
// AdamW over ranges of flat buffers. optim/ sits below model/, so it knows
// ranges (offset, length, decay) and not parameter names.

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace apiary::optim {

struct ParamRange {
    int64_t offset = 0;  // into the optimizer's state (and, by default, params and grads)
    int64_t numel = 0;
    bool decay = true;
    // Where the range sits in the params / grads arrays passed to step(),
    // when not at `offset` (-1): under ZeRO the state is a packed shard
    // while the parameters may still be the whole flat buffer.
    int64_t param_offset = -1;
    int64_t grad_offset = -1;
    // Counted in grad_norm(): false where another rank holds the same
    // gradient and counts it (data-parallel replicas, tensors replicated
    // over tensor-parallel ranks, a tied embedding's second copy), so that
    // the sum of every rank's grad_norm()^2 is the global norm squared.
    bool in_norm = true;
    // Not trained (fine-tuning with frozen layers): step() leaves the
    // parameters and their state as they are.
    bool frozen = false;
    int64_t param_at() const { return param_offset < 0 ? offset : param_offset; }
    int64_t grad_at() const { return grad_offset < 0 ? offset : grad_offset; }
};

struct AdamWOptions {
    float beta1 = 0.9f;
    float beta2 = 0.95f;
    float eps = 1e-8f;
    float weight_decay = 0.1f;
    float grad_clip = 1.0f;  // global L2 norm; <= 0 disables clipping
};

class AdamW {
  public:
    // State (m, v) covers [shard_begin, shard_end) of the parameters' flat
    // layout (default: all of [0, flat_size)); step() updates only that
    // window. (Only a test narrows it: the engine's ZeRO stages give each
    // rank's pieces as packed ranges instead, parallel/zero.h.)
    AdamW(std::vector<ParamRange> ranges, int64_t flat_size, AdamWOptions options,
          int64_t shard_begin = 0, int64_t shard_end = -1);

    // Gradient L2 norm over the ranges counted in it (double accumulation).
    double grad_norm(const float* grads) const;
    // One update at learning rate lr. grads are multiplied by grad_scale and,
    // if clipping is on and the scaled norm exceeds grad_clip, scaled down to
    // it. Returns the norm before clipping.
    // raw_norm, if >= 0, is grad_norm(grads) already computed by the caller.
    // params_bf16, if non-null, is a bf16 copy of params (same flat layout):
    // every element step() updates is also written there, rounded to
    // nearest even, in the same pass (bf16 training's weight copy).
    double step(float* params, const float* grads, float lr, float grad_scale = 1.0f,
                double raw_norm = -1.0, uint16_t* params_bf16 = nullptr);
    // Whether step() updates every parameter of the flat buffers, so that a
    // bf16 copy written by it is complete. Not under a sharded optimizer
    // (ZeRO): there the copy must be cast again after the parameters are
    // gathered.
    bool updates_all_params() const;

    int64_t step_count() const { return t_; }
    void set_step_count(int64_t t) { t_ = t; }
    // m and v of the shard: element i is flat offset shard_begin() + i.
    float* m() { return m_.f32(); }
    float* v() { return v_.f32(); }
    int64_t shard_begin() const { return begin_; }
    int64_t shard_end() const { return end_; }
    const AdamWOptions& options() const { return opt_; }

  private:
    std::vector<ParamRange> ranges_;
    int64_t flat_size_;
    AdamWOptions opt_;
    int64_t begin_, end_;
    core::Tensor m_, v_;
    int64_t t_ = 0;
};

// Learning rate at optimizer step `step` (0-based): linear warmup from 0 to
// peak over warmup steps, then cosine decay to min_lr at total steps.
double lr_schedule(int64_t step, int64_t total, int64_t warmup, double peak, double min_lr);

}  // namespace apiary::optim
