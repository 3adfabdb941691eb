#pragma once
// GPT-2 and LLaMA decoder-only transformers with explicit forward and
// backward per block (no autograd). Single-device: parallelism is applied
// from parallel/. Parameters and gradients live in flat buffers described by
// a ParamRegistry; activations are allocated once for the largest (B, T).

#include <cstdint>
#include <vector>

#include "core/model_spec.h"
#include "core/tensor.h"
#include "model/param_registry.h"

namespace apiary::model {

struct LossResult {
    double loss_sum = 0.0;  // summed cross-entropy over counted tokens (nats)
    int64_t count = 0;      // tokens with a target >= 0
    double mean() const { return count ? loss_sum / double(count) : 0.0; }
};

class Transformer {
public:
    // Allocates parameters, gradients and activations for micro-batches up to
    // (max_B, max_T); max_T may not exceed spec.max_seq_len.
    Transformer(const core::ModelSpec& spec, int64_t max_B, int64_t max_T);

    const core::ModelSpec& spec() const { return spec_; }
    const ParamRegistry& registry() const { return registry_; }
    float* params() { return params_.f32(); }
    const float* params() const { return params_.f32(); }
    float* grads() { return grads_.f32(); }
    int64_t flat_size() const { return registry_.total(); }
    float* param(const std::string& name) { return params() + registry_.get(name).offset; }
    float* grad(const std::string& name) { return grads() + registry_.get(name).offset; }

    // GPT-2 initialisation: N(0, 0.02), output projections N(0, 0.02/sqrt(2L)),
    // biases 0, norm weights 1. Every element is a pure function of (seed,
    // tensor name, index), so any rank can initialise any slice.
    void init(uint64_t seed);
    void zero_grads();

    // Forward and backward of one micro-batch: tokens, targets (B, T); a
    // target < 0 is not counted. Gradients of (loss_sum * grad_scale) are
    // ADDED to grads(), so micro-steps accumulate.
    LossResult forward_backward(const int32_t* tokens, const int32_t* targets, int64_t B,
                                int64_t T, float grad_scale);
    // Forward only, loss streamed over vocabulary chunks (evaluation).
    LossResult evaluate(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T);
    // Full logits (B, T, V), for tests and small-vocabulary checks.
    void forward_logits(float* logits, const int32_t* tokens, int64_t B, int64_t T);
    // Logits (V) of the last position of a single sequence (generation).
    void last_logits(float* logits, const int32_t* tokens, int64_t T);

    int64_t max_B() const { return max_B_; }
    int64_t max_T() const { return max_T_; }

private:
    struct LayerActs;
    void build_registry();
    void allocate_activations();
    // Runs the blocks and the final norm: leaves lnf_ (B*T, C) ready for the head.
    void forward_body(const int32_t* tokens, int64_t B, int64_t T);
    void backward_body(const int32_t* tokens, int64_t B, int64_t T);
    void block_forward(int l, int64_t B, int64_t T);
    void block_backward(int l, int64_t B, int64_t T);
    const float* head_weight() const;
    float* head_grad();

    core::ModelSpec spec_;
    int64_t max_B_, max_T_;
    ParamRegistry registry_;
    core::Tensor params_, grads_;

    // Activations saved for backward, one set per block, each sized for
    // (max_B, max_T). Stored as offsets into one arena.
    core::Tensor arena_;
    struct LayerOffsets {
        int64_t norm1, norm1_mean, norm1_rstd, qkv, atty, lse, res2, norm2, norm2_mean, norm2_rstd,
            fc, fc_act, res3;
    };
    std::vector<LayerOffsets> layer_;
    int64_t encoded_ = 0, lnf_ = 0, lnf_mean_ = 0, lnf_rstd_ = 0;
    // Backward scratch shared by all blocks.
    core::Tensor dres_, dnorm_, dqkv_, datty_, dfc_, dfc_act_, head_scratch_;
    core::Tensor rope_cos_, rope_sin_;
    float* act(int64_t offset) { return arena_.f32() + offset; }
};

}  // namespace apiary::model
