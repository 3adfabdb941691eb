#pragma once
// Memory per device: model states (Rajbhandari et al. 2020, ZeRO), activations
// (Korthikanti et al. 2022, Table 2, generalised) and communication buffers.

#include "plan/types.h"

namespace apiary::plan {

// Bytes per parameter of the weights, gradients and optimizer state. Mixed
// precision (bf16, fp16, fp8): 2 + 2 + 12 (fp32 master, Adam m and v), the K = 12
// of the ZeRO paper; fp32: 4 + 4 + 8.
struct StateBytes {
    double weight, grad, optimizer;
};
StateBytes state_bytes(Dtype dtype);

// Bytes of one element of a stored activation.
double act_bytes(Dtype dtype);

// Parameters of one transformer block (the average over the blocks for a
// mixture of experts), of one expert, and of everything outside the blocks.
double layer_params(const core::ModelSpec& m);
double expert_params(const core::ModelSpec& m);  // one routed expert's MLP
double embed_params(const core::ModelSpec& m);   // token (+ position) embeddings
double head_params(const core::ModelSpec& m);    // LM head + final norm, untied

// Model-state bytes per device for a model of `params` on `dp` ranks at a
// ZeRO stage, exactly as the ZeRO paper's closed forms (no tp/pp).
double zero_model_state_bytes(double params, long long dp, int stage, Dtype dtype);

// Activation bytes of one GPT block for one micro-batch on one device with
// the attention scores stored (Korthikanti et al. 2022, Table 2), scaled for
// fp32. block_activation_bytes generalises it (below).
double layer_activation_bytes(const core::ModelSpec& m, int seq_len, int micro_batch, int tp,
                              bool sp, Recompute r, Dtype dtype);

// Activation bytes of one block (a MoE block when `experts`) for one
// micro-batch on one device, tensor by tensor as Korthikanti et al. 2022
// count them, for any attention (grouped-query, latent), MLP (GeLU, SwiGLU),
// fused or stored attention scores, 1/cp of the sequence, and routed
// experts (each token's k copies, padded by the capacity factor). For a
// GPT block with stored scores it equals layer_activation_bytes.
double block_activation_bytes(const Workload& w, const Layout& l, bool experts, Recompute r);

// Blocks of each virtual stage (chunk c of stage s is virtual stage c pp + s):
// parallel.stage_layers when given. Otherwise apiary's trainer balances the
// blocks of a non-interleaved pipeline by FLOPs with the LM head counted on
// the last stage (core::balanced_stage_layers, what src/parallel runs); the
// other stacks split evenly when pp x v divides L (Megatron-LM requires it)
// and otherwise give ceil(L / (pp v)) blocks to each virtual stage in order,
// the remainder to the last ones (126 layers on 16 stages: 8 x 15 + 6).
std::vector<int> virtual_stage_layers(const Workload& w, const Layout& l, Impl impl);

// Blocks of each pipeline stage (all its chunks) and how many of them have
// experts. The first stage also holds the embedding, the last the LM head.
struct StageSplit {
    std::vector<int> blocks, moe;
    int fullest() const;  // the most blocks on one stage
};
StageSplit stage_split(const Workload& w, const Layout& l, Impl impl);

// Parameters one device of a pipeline stage holds: those replicated over the
// data-parallel ranks (dense) and the expert weights (sharded over ep).
struct StageParams {
    double dense = 0, expert = 0;
    double total() const { return dense + expert; }
};
StageParams stage_param_split(const core::ModelSpec& m, const Layout& l, const StageSplit& split,
                              int stage);

// Parameters held by one device on the pipeline stage that holds the most.
double stage_params_per_device(const core::ModelSpec& m, const Layout& l, const StageSplit& split);

// Memory of the pipeline stage that needs the most (every stage is costed:
// its blocks, micro-batches in flight, and the embedding or head it owns).
Memory memory_per_device(const Workload& w, const Layout& l, const Cluster& c);

}  // namespace apiary::plan
