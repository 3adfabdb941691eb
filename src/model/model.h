#pragma once
// GPT-2 and LLaMA decoder-only transformers with explicit forward and
// backward per block (no autograd). Single-device: parallelism is applied
// from parallel/. Parameters and gradients live in flat buffers described by
// a ParamRegistry; activations are allocated once for the largest (B, T).

#include <cstdint>
#include <functional>
#include <vector>

#include "core/error.h"
#include "core/model_spec.h"
#include "core/tensor.h"
#include "model/param_registry.h"

namespace apiary::model {

// Compute precision of the matrix multiplies. Master weights, gradients,
// norms, softmax, the loss and the optimizer stay fp32 in every mode.
//   fp32: everything fp32.
//   bf16: matmul operands (weights, saved inputs, incoming gradients) in bf16
//         with fp32 accumulation; the saved matmul inputs are stored in bf16.
//   fp16: emulated: matmul operands rounded to the fp16 grid (inf beyond
//         65504), fp32 arithmetic. What matters is the loss scaler's logic.
enum class Precision { fp32, bf16, fp16 };
Precision parse_precision(const std::string& name);  // throws ConfigError

// Where the model's parameters and gradients live.
//   full:          both flat buffers are the model's own (single device, DDP,
//                  ZeRO-1).
//   sharded_grads: no gradient buffer; a UnitStore lends each unit's
//                  gradients while backward writes them (ZeRO-2).
//   sharded:       neither buffer; the store also lends each unit's
//                  parameters while the model uses them (ZeRO-3).
enum class Storage { full, sharded_grads, sharded };

// A contiguous range of the flat buffers that ZeRO reduces, shards and
// gathers as one: the embeddings (unit 0), block l (unit l + 1), and what
// follows the last block (final norm, untied head; unit n_layer + 1). Every
// unit starts and ends on a multiple of the model's flat_multiple, so each
// splits into equal aligned pieces, one per data-parallel rank.
struct Unit {
    int64_t begin = 0, end = 0;
    int64_t size() const { return end - begin; }
};

// Lends units' buffers to the model (parallel/ implements it for ZeRO-2/3).
// Pointers map element `begin` of the unit. Calls come in the same order on
// every rank, so an implementation may issue collectives from them.
class UnitStore {
public:
    virtual ~UnitStore() = default;
    // Unit u's parameters, valid until release_params(u). `next` is the unit
    // the model will ask for after u (-1: none known), to be prefetched.
    virtual const float* acquire_params(int u, int next) = 0;
    // The same parameters rounded to bf16 (bf16 models), valid as long.
    virtual const uint16_t* params_bf16(int u) = 0;
    virtual void release_params(int u) = 0;
    // A zeroed buffer for unit u's gradients of this micro-step; backward
    // adds into it. release_grads(u): they are complete.
    virtual float* acquire_grads(int u) = 0;
    virtual void release_grads(int u) = 0;
};

struct LossResult {
    double loss_sum = 0.0;  // summed cross-entropy over counted tokens (nats)
    int64_t count = 0;      // tokens with a target >= 0
    double mean() const { return count ? loss_sum / double(count) : 0.0; }
};

class Transformer {
public:
    // Allocates parameters, gradients and activations for micro-batches up to
    // (max_B, max_T); max_T may not exceed spec.max_seq_len.
    // flat_multiple: the flat buffers' length is padded to a multiple of it
    // (data parallelism shards them into equal parts).
    // storage != full: the buffers come from set_unit_store() (ZeRO-2/3);
    // Storage::sharded takes fp32 or bf16 (the store lends the bf16 copy).
    Transformer(const core::ModelSpec& spec, int64_t max_B, int64_t max_T,
                Precision precision = Precision::fp32, int64_t flat_multiple = 16,
                Storage storage = Storage::full);

    const core::ModelSpec& spec() const { return spec_; }
    const ParamRegistry& registry() const { return registry_; }
    // Mutable access marks the reduced-precision weight copy stale; the next
    // forward refreshes it.
    // The whole flat buffers (not under Storage::sharded / sharded_grads).
    float* params() {
        APIARY_CHECK(params_.numel() > 0, "the parameters are sharded: no flat buffer");
        shadow_stale_ = true;
        return params_.f32();
    }
    const float* params() const { return params_.f32(); }
    float* grads() {
        APIARY_CHECK(grads_.numel() > 0, "the gradients are sharded: no flat buffer");
        return grads_.f32();
    }
    int64_t flat_size() const { return flat_size_; }
    Precision precision() const { return precision_; }
    Storage storage() const { return storage_; }
    const std::vector<Unit>& units() const { return units_; }
    // Gradient of a parameter (its unit's gradients must be resident).
    float* grad(const std::string& name);
    // Required before forward when storage() != full; not owned.
    void set_unit_store(UnitStore* store) { store_ = store; }

    // GPT-2 initialisation: N(0, 0.02), output projections N(0, 0.02/sqrt(2L)),
    // biases 0, norm weights 1. Every element is a pure function of (seed,
    // tensor name, index), so any rank can initialise any slice.
    void init(uint64_t seed);
    // The same values written into dst (flat_size floats), for callers that
    // hold the parameters themselves (ZeRO-3).
    void init_into(uint64_t seed, float* dst) const;
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

    // Called during backward whenever the gradients of every parameter at
    // flat offset >= final_from are complete (blocks finish last-to-first,
    // the embeddings, at offset 0, last): data parallelism starts each
    // bucket's all-reduce from here while the rest of backward runs.
    void set_grad_ready_hook(std::function<void(int64_t final_from)> hook) {
        grad_ready_ = std::move(hook);
    }
    int64_t max_B() const { return max_B_; }
    int64_t max_T() const { return max_T_; }

    // bf16 mode: the bf16 weight copy the matmuls read (null in other
    // modes), for an optimizer step that writes it as it updates the fp32
    // weights (AdamW::step's params_bf16). Once such a step has written
    // every parameter, bf16_weights_written() marks the copy current;
    // otherwise the next forward casts all the weights again, as after any
    // mutable params().
    uint16_t* bf16_weights() {
        return precision_ == Precision::bf16 ? shadow_.data<uint16_t>() : nullptr;
    }
    void bf16_weights_written() { shadow_stale_ = false; }

private:
    struct LayerActs;
    void build_registry(int64_t flat_multiple);
    // Unit residency under a UnitStore (no-ops with full storage).
    void use_params(int u, int next);
    void drop_params(int u);
    void use_grads(int u);
    void done_grads(int u);
    void end_pass();  // releases the embedding and final units after a pass
    int post_unit() const { return spec_.n_layer + 1; }
    void allocate_activations();
    // Runs the blocks and the final norm: leaves lnf_ (B*T, C) ready for the head.
    void forward_body(const int32_t* tokens, int64_t B, int64_t T);
    void backward_body(const int32_t* tokens, int64_t B, int64_t T);
    void block_forward(int l, int64_t B, int64_t T);
    struct LayerOffsets;
    // LayerNorm of the "<prefix>weight" / "bias" parameters into act(out),
    // returned; in bf16 mode into half(out_half) only (the next matmul's
    // input), returning null for lin_fwd.
    float* layernorm_fwd(int64_t out, int64_t out_half, int64_t mean, int64_t rstd,
                         const float* in, const std::string& prefix, int64_t N);
    // Attention in the model's precision (fp32 attention for fp16 too: its
    // emulation is about the matmuls' gradient range). The forward returns
    // the fp32 output, or null in bf16 mode where it is written to atty_h.
    float* attention_fwd(LayerOffsets& a, int64_t B, int64_t T);
    void attention_bwd(LayerOffsets& a, int64_t B, int64_t T);
    void block_backward(int l, int64_t B, int64_t T);
    const float* head_weight() const;
    float* head_grad();
    const std::string& head_name() const;
    const float* param(const std::string& name) const;
    // Matrix multiplies in the model's precision. x is the fp32 input;
    // x_half the offset of its bf16 copy in arena_half_ (bf16 mode; x null:
    // the copy is already there). The backward takes the same x / x_half the
    // forward saved; in bf16 mode dy null means grad_half_ already holds the
    // bf16 dy and the bias gradient was added.
    void lin_fwd(float* y, float* x, int64_t x_half, const std::string& w, const std::string& b,
                 int64_t N, int64_t IN, int64_t OUT);
    // lin_fwd (bf16 mode) whose output goes to half(y_half) in bf16, for an
    // output only ever read in bf16.
    void lin_fwd_to_half(int64_t y_half, float* x, int64_t x_half, const std::string& w,
                         const std::string& b, int64_t N, int64_t IN, int64_t OUT);
    void lin_bwd(float* dx, const std::string& w, const std::string& b, const float* dy,
                 const float* x, int64_t x_half, int64_t N, int64_t IN, int64_t OUT);
    void refresh_shadow();
    double head_forward_backward(const int32_t* targets, int64_t N, float grad_scale,
                                 int64_t* count);

    core::ModelSpec spec_;
    int64_t max_B_, max_T_;
    Precision precision_;
    Storage storage_;
    int64_t flat_size_ = 0;
    std::vector<Unit> units_;
    std::vector<int> unit_of_entry_;  // registry entry -> unit
    // Element `begin` of unit u's parameters / gradients, null while a
    // store has not lent them.
    std::vector<const float*> pbase_;
    std::vector<float*> gbase_;
    std::vector<const uint16_t*> hbase_;  // the bf16 weight copy, per unit
    UnitStore* store_ = nullptr;
    int unit_of(const ParamInfo& e) const {
        return unit_of_entry_[size_t(&e - registry_.entries().data())];
    }
    std::function<void(int64_t)> grad_ready_;
    // Weights in compute precision: bf16 (uint16) or fp16-rounded fp32.
    core::Tensor shadow_;
    bool shadow_stale_ = true;
    ParamRegistry registry_;
    core::Tensor params_, grads_;

    // Activations saved for backward, one set per block, each sized for
    // (max_B, max_T). Stored as offsets into one arena.
    core::Tensor arena_;
    struct LayerOffsets {
        int64_t norm1, norm1_mean, norm1_rstd, qkv, atty, lse, res2, norm2, norm2_mean, norm2_rstd,
            fc, fc_act, res3;
        // bf16 copies of the matmul inputs and of q, k, v (bf16 mode only).
        int64_t norm1_h = 0, qkv_h = 0, atty_h = 0, norm2_h = 0, fc_act_h = 0;
    };
    core::Tensor arena_half_;          // bf16 saved activations
    core::Tensor grad_half_;           // bf16 (or fp16-rounded) copy of an incoming gradient
    core::Tensor head_scratch_half_;   // bf16 logit gradients of one row block
    int64_t lnf_h_ = 0;
    uint16_t* half(int64_t offset) { return arena_half_.data<uint16_t>() + offset; }
    const uint16_t* wh(const std::string& name) const;
    std::vector<LayerOffsets> layer_;
    int64_t encoded_ = 0, lnf_ = 0, lnf_mean_ = 0, lnf_rstd_ = 0;
    // Backward scratch shared by all blocks.
    core::Tensor dres_, dnorm_, dqkv_, datty_, dfc_, dfc_act_, head_scratch_;
    core::Tensor rope_cos_, rope_sin_;
    float* act(int64_t offset) { return arena_.f32() + offset; }
};

}  // namespace apiary::model
