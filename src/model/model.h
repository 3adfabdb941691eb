#pragma once
// GPT-2 and LLaMA decoder-only transformers with explicit forward and
// backward per block (no autograd). Single-device code over the sizes of a
// shard (model/layout.h): parallelism is applied from parallel/, which picks
// the shard, lends ZeRO's buffers (UnitStore), supplies the tensor-parallel
// collectives (TensorParallelComm) and moves a pipeline stage's inputs and
// outputs. Parameters and gradients live in flat buffers described by a
// ParamRegistry; activations are allocated once for the largest (B, T), one
// set per micro-batch in flight (slot).

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/model_spec.h"
#include "core/tensor.h"
#include "model/layout.h"
#include "model/param_registry.h"
#include "model/tp_comm.h"

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
// gathers as one: the embeddings (unit 0), each block this rank holds (units
// 1.. in flat order), and what follows the last block (final norm, head).
// Units of parts this rank does not hold are empty. Every unit starts and
// ends on a multiple of flat_multiple, so each splits into equal aligned
// pieces, one per data-parallel rank.
struct Unit {
    int64_t begin = 0, end = 0;
    // Under expert parallelism (ep > 1) the routed experts of each MoE
    // block form a unit of their own, after the block's: they are
    // replicated over dp / ep ranks, not over all of them.
    bool expert = false;
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

// Expert load of one MoE block, summed over the training micro-batches
// since the last reset_moe_stats() (backward adds them; evaluation and
// recomputation do not count).
struct MoeLayerStats {
    int layer = -1;
    std::vector<int64_t> routed;   // (E) choices of each expert before the capacity cut
    std::vector<int64_t> dropped;  // (E) of those, the ones over capacity
    double aux_sum = 0.0, z_sum = 0.0;  // the two router losses, summed over micro-batches
    int64_t batches = 0;
};

struct ModelOptions {
    Precision precision = Precision::fp32;
    // The flat buffers' units are padded to a multiple of it (data
    // parallelism shards them into equal parts).
    int64_t flat_multiple = 16;
    Storage storage = Storage::full;
    ModelShard shard;
};

class Transformer {
  public:
    // Allocates parameters, gradients and activations for micro-batches up to
    // (max_B, max_T); max_T may not exceed spec.max_seq_len.
    // storage != full: the buffers come from set_unit_store() (ZeRO-2/3);
    // Storage::sharded takes fp32 or bf16 (the store lends the bf16 copy).
    Transformer(const core::ModelSpec& spec, int64_t max_B, int64_t max_T,
                const ModelOptions& options);
    Transformer(const core::ModelSpec& spec, int64_t max_B, int64_t max_T,
                Precision precision = Precision::fp32, int64_t flat_multiple = 16,
                Storage storage = Storage::full);
    ~Transformer();
    Transformer(const Transformer&) = delete;
    Transformer& operator=(const Transformer&) = delete;

    const core::ModelSpec& spec() const { return spec_; }
    const ModelShard& shard() const { return shard_; }
    const LocalDims& dims() const { return dims_; }
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
    // Required before forward when storage() != full; not owned.
    void set_unit_store(UnitStore* store) { store_ = store; }
    // Required when shard().tp_size > 1; not owned.
    void set_tp_comm(TensorParallelComm* tp) { tp_ = tp; }
    // Required when shard().ep_size > 1; not owned.
    void set_ep_comm(ExpertParallelComm* ep) { ep_ = ep; }

    // GPT-2 initialisation: N(0, 0.02), output projections N(0, 0.02/sqrt(2L)),
    // biases 0, norm weights 1. Every element is a pure function of (seed,
    // tensor name, global index), so any rank can initialise any slice.
    void init(uint64_t seed);
    // The same values written into dst (flat_size floats), for callers that
    // hold the parameters themselves (ZeRO-3).
    void init_into(uint64_t seed, float* dst) const;
    void zero_grads();

    // ---- one micro-batch through a pipeline stage ----
    // Forward of chunk `chunk` on micro-batch slot `slot`. The chunk that
    // holds the embedding takes tokens (B, T); the others take `input`
    // (rows() x C), the previous stage's output.
    void forward(int chunk, int slot, const int32_t* tokens, const float* input, int64_t B,
                 int64_t T);
    // The chunk's output (rows() x C) after forward, when it has no head.
    const float* output(int chunk, int slot);
    // The head's loss over targets (B, T) of the slot's micro-batch (target
    // < 0: not counted); with grad_scale it also leaves the gradient of
    // (loss_sum * grad_scale) ready for backward. Forward only: pass no
    // scale (evaluation streams over vocabulary chunks).
    LossResult head_loss(int chunk, int slot, const int32_t* targets, const float* grad_scale);
    // Backward of the chunk. grad_output (rows() x C) is the gradient of its
    // output; null for the chunk with the head (head_loss left it).
    // Parameter gradients are ADDED, so micro-steps accumulate.
    void backward(int chunk, int slot, const float* grad_output);
    // The gradient of the chunk's input (rows() x C) after backward, when it
    // has no embedding.
    const float* input_grad() const { return dres_.f32(); }
    // Rows of one micro-batch as this rank holds them between blocks: B*T,
    // or B*T / tp under sequence parallelism.
    int64_t rows(int64_t B, int64_t T) const;
    int num_chunks() const { return int(chunks_.size()); }
    // After the last micro-batch of a step (or an evaluation): releases the
    // embedding and final units, which stay lent across the step's passes.
    void end_pass();

    // ---- the whole model on one rank (shard().whole()) ----
    // Forward and backward of one micro-batch: tokens, targets (B, T); a
    // target < 0 is not counted. Gradients of (loss_sum * grad_scale) are
    // ADDED to grads(), so micro-steps accumulate.
    LossResult forward_backward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T,
                                float grad_scale);
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

    // The gradient scale of the current micro-batch's loss (head_loss's
    // grad_scale), for a pipeline stage without the head: the MoE blocks'
    // router losses enter the gradient scaled like the loss.
    void set_loss_grad_scale(float s) { moe_grad_scale_ = s; }
    // Expert load per MoE block (empty for a dense model), in block order.
    const std::vector<MoeLayerStats>& moe_stats() const { return moe_stats_; }
    void reset_moe_stats();

  private:
    // Entry indices of one block's parameters, resolved once (-1: absent).
    struct BlockParams : BlockHandles {
        // An MoE block (model/moe.cc): router, its selection bias (sigmoid
        // router), each expert's first (gate|up for SwiGLU) and second
        // matmul, and the shared experts' two matmuls (-1: none).
        bool moe = false;
        int router_w = -1, router_bias = -1, shared_fc_w = -1, shared_fc2_w = -1;
        std::vector<int> expert_fc_w, expert_fc2_w;
    };
    // Offsets of one block's saved activations in arena_ (f32) and
    // arena_half_ (bf16). Rows: n = this rank's rows between blocks, N = the
    // micro-batch's B*T (they differ under sequence parallelism).
    struct LayerActs {
        int64_t norm1 = 0;                       // (N, C) after the row all-gather
        int64_t norm1_mean = 0, norm1_rstd = 0;  // (n)
        int64_t qkv = 0;                         // (N, R)
        int64_t atty = 0;                        // (N, Cl)
        int64_t lse = 0;                         // (B, NH, T)
        int64_t res2 = 0;                        // (n, C)
        int64_t norm2 = 0;                       // (N, C)
        int64_t norm2_mean = 0, norm2_rstd = 0;  // (n)
        int64_t fc = 0;                          // (N, F) gpt2, (N, 2F) llama
        int64_t fc_act = 0;                      // (N, F)
        int64_t res3 = 0;                        // (n, C): the block's output
        // bf16 copies of the matmul inputs and of q, k, v (bf16 mode only).
        int64_t norm1_h = 0, qkv_h = 0, atty_h = 0, norm2_h = 0, fc_act_h = 0;
        int moe = -1;  // index into moe_acts_ (MoE blocks), replacing fc and fc_act
    };
    struct SlotActs {
        int64_t input = 0;              // (n, C): the embedding's output or the stage input
        std::vector<LayerActs> layers;  // per block of the chunk
        std::vector<int32_t> tokens;    // (B, T), for the embedding's backward
        int64_t B = 0, T = 0;
    };
    struct Chunk {
        std::vector<int> layers;  // global block indices
        bool embedding = false, head = false;
        std::vector<SlotActs> slots;
    };

    void build_registry();
    void add_block_params(int l);
    void build_units();
    void resolve_handles();
    int unit_of_layer(int l) const { return layer_unit_[size_t(l)]; }
    int embed_unit() const { return 0; }
    int post_unit() const { return int(units_.size()) - 1; }
    // Unit residency under a UnitStore (no-ops with full storage).
    void use_params(int u, int next);
    void drop_params(int u);
    void use_grads(int u);
    void done_grads(int u);
    void allocate_activations();

    // Parameter and gradient of registry entry i (their unit must be resident).
    const float* P(int i) const;
    float* G(int i);
    const uint16_t* H(int i) const;  // bf16 weight copy

    void embed_forward(SlotActs& s, const int32_t* tokens, int64_t B, int64_t T);
    void embed_backward(SlotActs& s);
    void block_forward(int l, const LayerActs& a, const float* in, int64_t B, int64_t T);
    void block_backward(int l, const LayerActs& a, const float* in, int64_t B, int64_t T);
    // The dense MLP's backward: from dres_ (the block output's gradient) to
    // dnorm_ (its normed input's).
    void mlp_backward(const BlockParams& p, const LayerActs& a, int64_t N, int64_t n);
    void attention_core_forward(const LayerActs& a, int64_t B, int64_t T);
    void attention_core_backward(const LayerActs& a, int64_t B, int64_t T);
    // LayerNorm / RMSNorm of `in` (n rows) into the matmul input of N rows:
    // writes this rank's block and all-gathers the rest under sequence
    // parallelism; bf16 mode writes only the bf16 copy.
    // Returns the fp32 output for lin_fwd, or null when only the bf16 copy
    // was written (out_half < 0: always the fp32 output).
    float* norm_forward(int w, int b, int64_t out, int64_t out_half, int64_t mean, int64_t rstd,
                        const float* in, int64_t n);
    // The matching backward: dnorm (N, C), this rank's part of the gradient
    // of the norm's (gathered) output, is combined over the ranks, then the
    // norm's backward adds the input gradient into dres (n rows).
    void norm_backward(int w, int b, const float* dnorm, const float* in, int64_t mean,
                       int64_t rstd, int64_t n);
    // A row-parallel matmul's partial output (N, C) in partial_ (with tp >
    // 1), summed over ranks into out (n rows), then its bias added once.
    void row_parallel_output(float* out, int bias, int64_t n);
    // The gradient (N, C) a row-parallel matmul's backward reads: dres itself,
    // or all ranks' rows of it under sequence parallelism.
    const float* row_parallel_grad(int64_t n);

    // Matrix multiplies in the model's precision. x is the fp32 input;
    // x_half the offset of its bf16 copy in arena_half_ (bf16 mode; x null:
    // the copy is already there). The backward takes the same x / x_half the
    // forward saved; in bf16 mode dy null means grad_half_ already holds the
    // bf16 dy and the bias gradient was added.
    void lin_fwd(float* y, float* x, int64_t x_half, int w, int b, int64_t N, int64_t IN,
                 int64_t OUT);
    // lin_fwd (bf16 mode) whose output goes to half(y_half) in bf16, for an
    // output only ever read in bf16.
    void lin_fwd_to_half(int64_t y_half, float* x, int64_t x_half, int w, int b, int64_t N,
                         int64_t IN, int64_t OUT);
    void lin_bwd(float* dx, int w, int b, const float* dy, const float* x, int64_t x_half,
                 int64_t N, int64_t IN, int64_t OUT);
    void refresh_shadow();
    // ---- mixture of experts (model/moe.cc) ----
    struct MoeActs;
    void add_moe_params(int l);
    void resolve_moe_handles(int l, const std::string& prefix);
    void allocate_moe();
    // The MoE MLP: out (N, C) = shared experts + routed experts of x (N, C).
    void moe_forward(int l, const LayerActs& a, const float* x, float* out, int64_t N);
    // From dy (N, C): parameter gradients added, dnorm_ (N, C) written.
    void moe_backward(int l, const LayerActs& a, const float* x, const float* dy, int64_t N);
    // The LM head and cross-entropy over lnf_ (N rows): the summed loss, and
    // with grad_scale the gradient of the final norm's output in dnorm_.
    double head_loss_sum(const int32_t* targets, int64_t N, const float* grad_scale,
                         int64_t* count);
    void report_ready(int64_t final_from) {
        if (grad_ready_) grad_ready_(final_from);
    }
    void check_tokens(const int32_t* tokens, int64_t n) const;
    void check_shape(int64_t B, int64_t T) const;

    core::ModelSpec spec_;
    ModelShard shard_;
    LocalDims dims_;
    int64_t max_B_, max_T_;
    Precision precision_;
    Storage storage_;
    int64_t flat_multiple_;
    int64_t flat_size_ = 0;
    std::vector<Chunk> chunks_;
    std::vector<int> local_layers_;  // every block this rank holds, in flat order
    std::vector<int> layer_unit_;    // global block -> unit (-1: not held)
    std::vector<int> expert_unit_;   // global block -> its experts' unit (ep > 1; else -1)
    std::vector<Unit> units_;
    std::vector<int> unit_of_entry_;  // registry entry -> unit
    // Element `begin` of unit u's parameters / gradients, null while a
    // store has not lent them.
    std::vector<const float*> pbase_;
    std::vector<float*> gbase_;
    std::vector<const uint16_t*> hbase_;  // the bf16 weight copy, per unit
    UnitStore* store_ = nullptr;
    TensorParallelComm* tp_ = nullptr;
    ExpertParallelComm* ep_ = nullptr;
    std::function<void(int64_t)> grad_ready_;
    // Weights in compute precision: bf16 (uint16) or fp16-rounded fp32.
    core::Tensor shadow_;
    bool shadow_stale_ = true;
    ParamRegistry registry_;
    core::Tensor params_, grads_;

    std::vector<BlockParams> block_params_;  // per global block (empty where not held)
    int wte_ = -1, wpe_ = -1, lnf_w_ = -1, lnf_b_ = -1, head_w_ = -1;

    // Activations: offsets into two arenas (f32 and bf16).
    core::Tensor arena_, arena_half_;
    LayerActs work_;  // recomputed activations, shared by every block
    // The final norm's output (N, C; bf16 copy in arena_half_) and
    // statistics (n), computed and consumed within head_loss().
    int64_t lnf_ = 0, lnf_mean_ = 0, lnf_rstd_ = 0, lnf_h_ = 0;
    core::Tensor grad_half_;          // bf16 (or fp16-rounded) copy of an incoming gradient
    core::Tensor head_scratch_half_;  // bf16 logit gradients of one row block
    uint16_t* half(int64_t offset) { return arena_half_.data<uint16_t>() + offset; }
    float* act(int64_t offset) { return arena_.f32() + offset; }
    // Backward scratch shared by all blocks. dres_ (n, C) carries the
    // residual stream's gradient; dfull_ and partial_ (N, C) hold all ranks'
    // rows under tensor / sequence parallelism.
    core::Tensor dres_, dnorm_, dqkv_, datty_, dfc_, dfc_act_, head_scratch_, dfull_, partial_;
    core::Tensor rope_cos_, rope_sin_;
    // MoE: saved routing and expert activations per (block, slot), shared
    // backward scratch, the load statistics, and the gradient scale of the
    // current micro-batch's loss (head_loss sets it; the router losses are
    // scaled like the cross-entropy of N tokens).
    std::vector<MoeActs> moe_acts_;
    core::Tensor moe_dye_, moe_dh_, moe_dact_, moe_dxg_, moe_dgate_, moe_dlogits_;
    core::Tensor moe_dsh_h_, moe_dsh_act_;
    core::Tensor moe_ep_buf_, moe_dyr_;  // expert parallelism (model/moe.cc)
    // ep > 1: sends this rank's routed rows to the experts' ranks (xg ->
    // xr, expert-major) and sets the block's counts; returns the rows.
    int64_t moe_dispatch(MoeActs& m);
    // The reverse: rows (R, C) expert-major on this rank -> out (M, C) in
    // the order of xg, on the ranks the rows came from.
    void moe_return(MoeActs& m, const float* rows, float* out);
    // The forward: rows in the order of xg (M, C) -> rows (R, C) expert-major here.
    void moe_send(MoeActs& m, const float* in, float* rows);
    std::vector<MoeLayerStats> moe_stats_;
    std::vector<int> moe_stat_of_layer_;
    float moe_grad_scale_ = 0.0f;
};

}  // namespace apiary::model
