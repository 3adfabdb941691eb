#pragma once
// A Transformer's single-device training step through device::Ops, so the
// same code runs on the CPU kernels (CpuOps) and on a GPU (CudaOps): the
// composition of blocks.cc and stage.cc for one rank (no tensor or pipeline
// parallelism, no mixture of experts, no recomputation), with parameters,
// gradients, AdamW moments and activations allocated once in the device's
// arena and sealed. The layout of the flat buffers is the Transformer's
// (its registry), so parameters move between the two as one copy.
//
// Precision: fp32, or bf16 matmuls (weights, saved inputs and incoming
// gradients rounded to bf16, fp32 accumulation) as the Transformer's bf16
// mode, except that attention and the LM head stay fp32 here (the CUDA
// attention kernel is fp32; the head's GEMMs take tf32 products on a GPU). This is the GPU
// backend's proof of composition (scripts/device-check.sh compares its loss curve on cuda with
// cpu); the trainer does not use it yet (docs/gpu.md).

#include <cstdint>
#include <vector>

#include "device/context.h"
#include "model/model.h"

namespace apiary::model {

struct DeviceAdamW {
    float lr = 3e-4f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f;
    float grad_clip = 1.0f;  // global norm; 0: none
};

class DeviceModel {
  public:
    // `host` gives the spec, the registry and the flat size (its buffers are
    // not used). Allocates everything for micro-batches up to (max_B, max_T)
    // on ctx's device, then seals the arena. Throws ConfigError for what it
    // does not run (MoE, tensor or pipeline shards, fp16).
    DeviceModel(const Transformer& host, int64_t max_B, int64_t max_T, Precision precision,
                device::DeviceContext& ctx);

    // Flat buffers (flat_size floats, the registry's layout) from / to the host.
    void load_params(const float* host_params);
    void read_params(float* host_params);
    void read_grads(float* host_grads);
    void zero_grads();

    // One micro-batch: tokens and targets (B, T) on the host; gradients of
    // (loss_sum * grad_scale) are ADDED to the gradient buffer.
    LossResult forward_backward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T,
                                float grad_scale);
    // AdamW on every tensor (decay per the registry), after clipping the
    // global gradient norm; step t is 1-based. Returns the norm before clipping.
    double adamw_step(const DeviceAdamW& a, int64_t t);

    int64_t flat_size() const { return flat_; }
    // Model FLOPs of one (B, T) forward+backward: 6 x weights x tokens plus
    // causal attention, as obs/ counts them for MFU.
    double step_flops(int64_t B, int64_t T) const;

  private:
    struct Layer {
        device::DeviceBuffer norm1, mean1, rstd1, qkv, atty, lse, res2, norm2, mean2, rstd2, fc,
            fc_act, res3, norm1_h, atty_h, norm2_h, fc_act_h;
    };
    using Handles = BlockHandles;
    float* P(int i) const;
    float* G(int i) const;
    const uint16_t* H(int i) const;
    void lin_fwd(float* y, const float* x, device::DeviceBuffer& x_half, int w, int b, int64_t N,
                 int64_t IN, int64_t OUT);
    void lin_bwd(float* dx, int w, int b, const float* dy, const float* x,
                 const device::DeviceBuffer& x_half, int64_t N, int64_t IN, int64_t OUT);
    void norm_fwd(int w, int b, Layer& a, bool second, const float* in, int64_t N);
    void norm_bwd(int w, int b, const float* dnorm, const float* in, const float* mean,
                  const float* rstd, int64_t N);
    void block_forward(int l, const float* in, int64_t B, int64_t T);
    void block_backward(int l, const float* in, int64_t B, int64_t T);

    const core::ModelSpec spec_;
    const ParamRegistry& registry_;
    LocalDims dims_;
    Precision precision_;
    device::DeviceContext& ctx_;
    device::Ops& ops_;
    int64_t flat_ = 0, max_B_ = 0, max_T_ = 0;
    bool gpt2_ = true;
    std::vector<Handles> handles_;
    int wte_ = -1, wpe_ = -1, lnf_w_ = -1, lnf_b_ = -1, head_w_ = -1;
    device::DeviceBuffer params_, grads_, m_, v_, params_h_, tokens_, targets_, input_, lnf_,
        lnf_mean_, lnf_rstd_, dres_, dnorm_, dqkv_, datty_, dfc_, dfc_act_, dy_h_, head_scratch_,
        attn_scratch_, rope_cos_, rope_sin_;
    std::vector<Layer> layers_;
};

}  // namespace apiary::model
