// DeviceModel: blocks.cc and stage.cc for one rank, through device::Ops.
// Each step mirrors the Transformer's (same kernels in the same order with
// CpuOps), so tests/model/device_model_test.cc can hold it to the
// Transformer on the CPU, and the GPU run to the CPU run.

#include "model/device_model.h"

#include <fmt/format.h>

#include <cmath>

#include "core/error.h"
#include "kernels/kernels.h"

namespace apiary::model {

using core::MemCategory;
using device::DeviceBuffer;

namespace {

DeviceBuffer alloc(device::DeviceContext& ctx, int64_t n, size_t elem, MemCategory c,
                   const std::string& what) {
    return ctx.arena().allocate(size_t(std::max<int64_t>(n, 1)) * elem, c, what);
}

}  // namespace

DeviceModel::DeviceModel(const Transformer& host, int64_t max_B, int64_t max_T, Precision precision,
                         device::DeviceContext& ctx)
    : spec_(host.spec()),
      registry_(host.registry()),
      dims_(host.dims()),
      precision_(precision),
      ctx_(ctx),
      ops_(ctx.ops()),
      flat_(host.flat_size()),
      max_B_(max_B),
      max_T_(max_T),
      gpt2_(spec_.arch == core::Arch::gpt2) {
    if (spec_.moe() || host.shard().tp_size > 1 || host.num_chunks() != 1 ||
        !host.shard().embedding || !host.shard().head) {
        throw ConfigError(
            "the device step runs the whole dense model on one rank (no mixture of experts, "
            "tensor or pipeline parallelism yet)");
    }
    if (precision == Precision::fp16) {
        throw ConfigError("the device step runs fp32 or bf16 (not yet fp16)");
    }
    const auto& r = registry_;
    handles_.resize(size_t(spec_.n_layer));
    for (int l = 0; l < spec_.n_layer; ++l) handles_[size_t(l)] = block_handles(r, gpt2_, l);
    const std::string wte = gpt2_ ? "wte.weight" : "model.embed_tokens.weight";
    wte_ = r.index_of(wte);
    wpe_ = r.index_of("wpe.weight");
    lnf_w_ = r.index_of(gpt2_ ? "ln_f.weight" : "model.norm.weight");
    lnf_b_ = r.index_of("ln_f.bias");
    head_w_ = r.index_of(spec_.tie_embeddings ? wte : "lm_head.weight");

    const int64_t N = max_B * max_T, C = dims_.C, R = dims_.R(), Cl = dims_.Cl(), F = dims_.F,
                  V = dims_.Vl, FF = gpt2_ ? F : 2 * F;
    const bool bf16 = precision == Precision::bf16;
    auto f32 = [&](int64_t n, MemCategory c, const char* what) {
        return alloc(ctx, n, sizeof(float), c, what);
    };
    auto h16 = [&](int64_t n, const char* what) {
        return bf16 ? alloc(ctx, n, sizeof(uint16_t), MemCategory::activations, what)
                    : DeviceBuffer();
    };
    params_ = f32(flat_, MemCategory::params, "flat parameters");
    grads_ = f32(flat_, MemCategory::grads, "flat gradients");
    m_ = f32(flat_, MemCategory::optimizer, "AdamW m");
    v_ = f32(flat_, MemCategory::optimizer, "AdamW v");
    if (bf16) params_h_ = alloc(ctx, flat_, sizeof(uint16_t), MemCategory::params, "bf16 weights");
    tokens_ = alloc(ctx, N, sizeof(int32_t), MemCategory::buffers, "tokens");
    targets_ = alloc(ctx, N, sizeof(int32_t), MemCategory::buffers, "targets");
    input_ = f32(N * C, MemCategory::activations, "(B, T, C) embedding");
    layers_.resize(size_t(spec_.n_layer));
    for (Layer& a : layers_) {
        const auto A = MemCategory::activations;
        a.norm1 = f32(N * C, A, "norm1");
        a.mean1 = f32(N, A, "mean1");
        a.rstd1 = f32(N, A, "rstd1");
        a.qkv = f32(N * R, A, "qkv");
        a.atty = f32(N * Cl, A, "attention output");
        a.lse = f32(N * dims_.NH, A, "attention lse");
        a.res2 = f32(N * C, A, "res2");
        a.norm2 = f32(N * C, A, "norm2");
        a.mean2 = f32(N, A, "mean2");
        a.rstd2 = f32(N, A, "rstd2");
        a.fc = f32(N * FF, A, "fc");
        a.fc_act = f32(N * F, A, "fc activation");
        a.res3 = f32(N * C, A, "res3");
        a.norm1_h = h16(N * C, "norm1 bf16");
        a.atty_h = h16(N * Cl, "attention output bf16");
        a.norm2_h = h16(N * C, "norm2 bf16");
        a.fc_act_h = h16(N * F, "fc activation bf16");
    }
    lnf_ = f32(N * C, MemCategory::activations, "final norm");
    lnf_mean_ = f32(N, MemCategory::activations, "final norm mean");
    lnf_rstd_ = f32(N, MemCategory::activations, "final norm rstd");
    const auto S = MemCategory::buffers;
    dres_ = f32(N * C, S, "residual gradient");
    dnorm_ = f32(N * C, S, "norm gradient");
    dqkv_ = f32(N * R, S, "qkv gradient");
    datty_ = f32(N * Cl, S, "attention output gradient");
    dfc_ = f32(N * FF, S, "fc gradient");
    dfc_act_ = f32(N * F, S, "fc activation gradient");
    if (bf16) dy_h_ = alloc(ctx, N * std::max({R, C, FF}), sizeof(uint16_t), S, "bf16 gradient");
    head_scratch_ = f32(ops_.lm_head_scratch_floats(N, V), S, "head logits");
    attn_scratch_ = f32(ops_.attention_scratch_floats(max_B, max_T, dims_.NH), S, "attention");
    if (!gpt2_) {
        const int64_t half = dims_.HS / 2;
        std::vector<float> cs(size_t(max_T * half)), sn(cs.size());
        kernels::rope_tables(cs.data(), sn.data(), max_T, dims_.HS, spec_.rope_theta);
        rope_cos_ = f32(max_T * half, MemCategory::buffers, "rope cos");
        rope_sin_ = f32(max_T * half, MemCategory::buffers, "rope sin");
        ops_.to_device(rope_cos_.data(), cs.data(), cs.size() * sizeof(float));
        ops_.to_device(rope_sin_.data(), sn.data(), sn.size() * sizeof(float));
    }
    // bf16: the fp32 GEMMs left (the LM head) may take tf32 products, a
    // smaller rounding than the bf16 operands elsewhere.
    ops_.set_allow_tf32(bf16);
    ops_.fill_zero(grads_.data(), grads_.bytes());
    ops_.fill_zero(m_.data(), m_.bytes());
    ops_.fill_zero(v_.data(), v_.bytes());
    ctx.arena().seal();
}

float* DeviceModel::P(int i) const { return params_.f32() + registry_.entries()[size_t(i)].offset; }
float* DeviceModel::G(int i) const { return grads_.f32() + registry_.entries()[size_t(i)].offset; }
const uint16_t* DeviceModel::H(int i) const {
    return static_cast<const uint16_t*>(params_h_.data()) + registry_.entries()[size_t(i)].offset;
}

void DeviceModel::load_params(const float* host) {
    ops_.to_device(params_.data(), host, size_t(flat_) * sizeof(float));
    if (precision_ == Precision::bf16) {
        ops_.to_bf16(static_cast<uint16_t*>(params_h_.data()), params_.f32(), flat_);
    }
}
void DeviceModel::read_params(float* host) {
    ops_.to_host(host, params_.data(), size_t(flat_) * sizeof(float));
}
void DeviceModel::read_grads(float* host) {
    ops_.to_host(host, grads_.data(), size_t(flat_) * sizeof(float));
}
void DeviceModel::zero_grads() { ops_.fill_zero(grads_.data(), grads_.bytes()); }

void DeviceModel::lin_fwd(float* y, const float* x, DeviceBuffer& x_half, int w, int b, int64_t N,
                          int64_t IN, int64_t OUT) {
    const float* bias = b < 0 ? nullptr : P(b);
    if (precision_ == Precision::bf16) {
        auto* xh = static_cast<uint16_t*>(x_half.data());
        ops_.to_bf16(xh, x, N * IN);
        ops_.linear_forward_bf16(y, xh, H(w), bias, N, IN, OUT);
    } else {
        ops_.linear_forward(y, x, P(w), bias, N, IN, OUT);
    }
}

void DeviceModel::lin_bwd(float* dx, int w, int b, const float* dy, const float* x,
                          const DeviceBuffer& x_half, int64_t N, int64_t IN, int64_t OUT) {
    float* dbias = b < 0 ? nullptr : G(b);
    if (precision_ == Precision::bf16) {
        auto* dyh = static_cast<uint16_t*>(dy_h_.data());
        ops_.to_bf16(dyh, dy, N * OUT);
        if (dbias) ops_.linear_bias_backward(dbias, dy, N, OUT);
        ops_.linear_backward_bf16(dx, G(w), dyh, static_cast<const uint16_t*>(x_half.data()), H(w),
                                  N, IN, OUT);
    } else {
        ops_.linear_backward(dx, G(w), dbias, dy, x, P(w), N, IN, OUT);
    }
}

void DeviceModel::norm_fwd(int w, int b, Layer& a, bool second, const float* in, int64_t N) {
    float* out = second ? a.norm2.f32() : a.norm1.f32();
    float* mean = second ? a.mean2.f32() : a.mean1.f32();
    float* rstd = second ? a.rstd2.f32() : a.rstd1.f32();
    if (gpt2_) {
        ops_.layernorm_forward(out, mean, rstd, in, P(w), P(b), N, dims_.C, spec_.norm_eps);
    } else {
        ops_.rmsnorm_forward(out, rstd, in, P(w), N, dims_.C, spec_.norm_eps);
    }
}

void DeviceModel::norm_bwd(int w, int b, const float* dnorm, const float* in, const float* mean,
                           const float* rstd, int64_t N) {
    if (gpt2_) {
        ops_.layernorm_backward(dres_.f32(), G(w), G(b), dnorm, in, P(w), mean, rstd, N, dims_.C);
    } else {
        ops_.rmsnorm_backward(dres_.f32(), G(w), dnorm, in, P(w), rstd, N, dims_.C);
    }
}

void DeviceModel::block_forward(int l, const float* in, int64_t B, int64_t T) {
    const Handles& p = handles_[size_t(l)];
    Layer& a = layers_[size_t(l)];
    const int64_t N = B * T, C = dims_.C, F = dims_.F, R = dims_.R(), Cl = dims_.Cl(),
                  NH = dims_.NH, KVH = dims_.KVH, HS = dims_.HS;
    norm_fwd(p.ln1_w, p.ln1_b, a, false, in, N);
    lin_fwd(a.qkv.f32(), a.norm1.f32(), a.norm1_h, p.qkv_w, p.qkv_b, N, C, R);
    if (!gpt2_) {
        ops_.rope_apply(a.qkv.f32(), rope_cos_.f32(), rope_sin_.f32(), B, T, R, 0, NH, HS, false);
        ops_.rope_apply(a.qkv.f32(), rope_cos_.f32(), rope_sin_.f32(), B, T, R, NH * HS, KVH, HS,
                        false);
    }
    ops_.attention_forward(a.atty.f32(), a.lse.f32(), a.qkv.f32(), B, T, NH, KVH, HS);
    lin_fwd(a.res2.f32(), a.atty.f32(), a.atty_h, p.proj_w, p.proj_b, N, Cl, C);
    ops_.add_inplace(a.res2.f32(), in, N * C);
    norm_fwd(p.ln2_w, p.ln2_b, a, true, a.res2.f32(), N);
    lin_fwd(a.fc.f32(), a.norm2.f32(), a.norm2_h, p.fc_w, p.fc_b, N, C, gpt2_ ? F : 2 * F);
    if (gpt2_) {
        ops_.gelu_forward(a.fc_act.f32(), a.fc.f32(), N * F);
    } else {
        ops_.swiglu_forward(a.fc_act.f32(), a.fc.f32(), N, F);
    }
    lin_fwd(a.res3.f32(), a.fc_act.f32(), a.fc_act_h, p.fc2_w, p.fc2_b, N, F, C);
    ops_.add_inplace(a.res3.f32(), a.res2.f32(), N * C);
}

void DeviceModel::block_backward(int l, const float* in, int64_t B, int64_t T) {
    const Handles& p = handles_[size_t(l)];
    Layer& a = layers_[size_t(l)];
    const int64_t N = B * T, C = dims_.C, F = dims_.F, R = dims_.R(), Cl = dims_.Cl(),
                  NH = dims_.NH, KVH = dims_.KVH, HS = dims_.HS;
    lin_bwd(dfc_act_.f32(), p.fc2_w, p.fc2_b, dres_.f32(), a.fc_act.f32(), a.fc_act_h, N, F, C);
    if (gpt2_) {
        ops_.gelu_backward(dfc_.f32(), a.fc.f32(), dfc_act_.f32(), N * F);
    } else {
        ops_.swiglu_backward(dfc_.f32(), dfc_act_.f32(), a.fc.f32(), N, F);
    }
    lin_bwd(dnorm_.f32(), p.fc_w, p.fc_b, dfc_.f32(), a.norm2.f32(), a.norm2_h, N, C,
            gpt2_ ? F : 2 * F);
    norm_bwd(p.ln2_w, p.ln2_b, dnorm_.f32(), a.res2.f32(), a.mean2.f32(), a.rstd2.f32(), N);
    lin_bwd(datty_.f32(), p.proj_w, p.proj_b, dres_.f32(), a.atty.f32(), a.atty_h, N, Cl, C);
    ops_.attention_backward(dqkv_.f32(), datty_.f32(), a.qkv.f32(), a.atty.f32(), a.lse.f32(), B, T,
                            NH, KVH, HS, attn_scratch_.f32());
    if (!gpt2_) {
        ops_.rope_apply(dqkv_.f32(), rope_cos_.f32(), rope_sin_.f32(), B, T, R, 0, NH, HS, true);
        ops_.rope_apply(dqkv_.f32(), rope_cos_.f32(), rope_sin_.f32(), B, T, R, NH * HS, KVH, HS,
                        true);
    }
    lin_bwd(dnorm_.f32(), p.qkv_w, p.qkv_b, dqkv_.f32(), a.norm1.f32(), a.norm1_h, N, C, R);
    norm_bwd(p.ln1_w, p.ln1_b, dnorm_.f32(), in, a.mean1.f32(), a.rstd1.f32(), N);
}

LossResult DeviceModel::forward_backward(const int32_t* tokens, const int32_t* targets, int64_t B,
                                         int64_t T, float grad_scale) {
    APIARY_CHECK(B <= max_B_ && T <= max_T_, "micro-batch ({}, {}) beyond the allocated ({}, {})",
                 B, T, max_B_, max_T_);
    const int64_t N = B * T, C = dims_.C;
    for (int64_t i = 0; i < N; ++i) {
        if (tokens[i] < 0 || tokens[i] >= dims_.Vl) {
            throw DataError(fmt::format("token {} at position {} is outside the vocabulary of {}",
                                        tokens[i], i, dims_.Vl));
        }
    }
    ops_.to_device(tokens_.data(), tokens, size_t(N) * sizeof(int32_t));
    ops_.to_device(targets_.data(), targets, size_t(N) * sizeof(int32_t));
    const auto* tok = static_cast<const int32_t*>(tokens_.data());
    ops_.embedding_forward(input_.f32(), tok, P(wte_), wpe_ >= 0 ? P(wpe_) : nullptr, B, T, C);
    const float* in = input_.f32();
    for (int l = 0; l < spec_.n_layer; ++l) {
        block_forward(l, in, B, T);
        in = layers_[size_t(l)].res3.f32();
    }
    const float* last = in;
    if (gpt2_) {
        ops_.layernorm_forward(lnf_.f32(), lnf_mean_.f32(), lnf_rstd_.f32(), last, P(lnf_w_),
                               P(lnf_b_), N, C, spec_.norm_eps);
    } else {
        ops_.rmsnorm_forward(lnf_.f32(), lnf_rstd_.f32(), last, P(lnf_w_), N, C, spec_.norm_eps);
    }
    LossResult r;
    r.loss_sum = ops_.lm_head_cross_entropy(
        lnf_.f32(), P(head_w_), static_cast<const int32_t*>(targets_.data()), N, C, dims_.Vl,
        grad_scale, dnorm_.f32(), G(head_w_), &r.count, head_scratch_.f32(),
        int64_t(head_scratch_.bytes() / sizeof(float)));
    ops_.fill_zero(dres_.data(), size_t(N * C) * sizeof(float));
    norm_bwd(lnf_w_, lnf_b_, dnorm_.f32(), last, lnf_mean_.f32(), lnf_rstd_.f32(), N);
    for (int l = spec_.n_layer - 1; l >= 0; --l) {
        const float* block_in = l == 0 ? input_.f32() : layers_[size_t(l - 1)].res3.f32();
        block_backward(l, block_in, B, T);
    }
    ops_.embedding_backward(G(wte_), wpe_ >= 0 ? G(wpe_) : nullptr, dres_.f32(), tok, B, T, C);
    return r;
}

double DeviceModel::adamw_step(const DeviceAdamW& a, int64_t t) {
    const double norm = std::sqrt(ops_.sum_squares(grads_.f32(), flat_));
    const float scale = (a.grad_clip > 0.0f && norm > double(a.grad_clip))
                            ? float(double(a.grad_clip) / norm)
                            : 1.0f;
    auto* h = static_cast<uint16_t*>(params_h_.data());
    for (const ParamInfo& e : registry_.entries()) {
        const int64_t o = e.offset;
        const float wd = e.decay ? a.weight_decay : 0.0f;
        if (h) {
            ops_.adamw_update_bf16_copy(params_.f32() + o, h + o, grads_.f32() + o, m_.f32() + o,
                                        v_.f32() + o, e.numel(), a.lr, a.beta1, a.beta2, a.eps, wd,
                                        t, scale);
        } else {
            ops_.adamw_update(params_.f32() + o, grads_.f32() + o, m_.f32() + o, v_.f32() + o,
                              e.numel(), a.lr, a.beta1, a.beta2, a.eps, wd, t, scale);
        }
    }
    return norm;
}

double DeviceModel::step_flops(int64_t B, int64_t T) const {
    return spec_.train_flops_per_token(T) * double(B * T);
}

}  // namespace apiary::model
