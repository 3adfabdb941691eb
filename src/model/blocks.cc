// The forward and backward passes of the transformer blocks. Each block's
// backward reads the gradient of its output from dres_ and leaves there the
// gradient of its input: the residual stream's gradient flows through one
// buffer, and each norm's backward adds its branch into it.
//
// Tensor parallelism (Megatron-LM): q|k|v, the MLP's first matmul and the
// head are column-parallel (whole heads, a slice of the width or of the
// vocabulary per rank), the attention output projection and the MLP's
// second matmul row-parallel. A row-parallel matmul's partial outputs are
// summed over the ranks (all-reduce; reduce-scatter of the rows under
// sequence parallelism) before its bias, added once, and the residual; in
// backward the gradient that reaches a norm from the column-parallel matmul
// after it is summed the same way. Everything between (norms, residuals)
// runs on every rank, or on each rank's rows under sequence parallelism.

#include <fmt/format.h>

#include <vector>

#include "core/error.h"
#include "core/profile.h"
#include "core/trace.h"
#include "kernels/kernels.h"
#include "model/model.h"

namespace apiary::model {

namespace k = apiary::kernels;
using core::Arch;

float* Transformer::norm_forward(int w, int b, int64_t out, int64_t out_half, int64_t mean,
                                 int64_t rstd, const float* in, int64_t n) {
    const int64_t C = dims_.C;
    const float eps = spec_.norm_eps;
    const bool sp = shard_.sequence_parallel;
    const int64_t row0 = sp ? shard_.tp_rank * n : 0;
    if (out_half >= 0 && spec_.arch == Arch::gpt2 && precision_ == Precision::bf16) {
        // The norm writes the next matmul's bf16 operand directly.
        uint16_t* o = half(out_half) + row0 * C;
        k::layernorm_forward_bf16(o, act(mean), act(rstd), in, P(w), P(b), n, C, eps);
        if (sp) tp_->all_gather_rows_bf16(o, half(out_half), n, C);
        return nullptr;
    }
    float* o = act(out) + row0 * C;
    if (spec_.arch == Arch::gpt2) {
        k::layernorm_forward(o, act(mean), act(rstd), in, P(w), P(b), n, C, eps);
    } else {
        k::rmsnorm_forward(o, act(rstd), in, P(w), n, C, eps);
    }
    if (sp) tp_->all_gather_rows(o, act(out), n, C);
    return act(out);
}

void Transformer::norm_backward(int w, int b, const float* dnorm, const float* in, int64_t mean,
                                int64_t rstd, int64_t n) {
    const int64_t C = dims_.C;
    // dnorm (N, C) is this rank's part of the gradient of the norm's output
    // (the column-parallel matmul after it saw a slice of the width).
    const float* d = dnorm;
    if (shard_.tp_size > 1) {
        APIARY_PROFILE("tensor-parallel communication");
        float* mine = const_cast<float*>(dnorm);
        if (shard_.sequence_parallel) {
            mine += shard_.tp_rank * n * C;
            tp_->reduce_scatter_rows(dnorm, mine, n, C);
        } else {
            tp_->all_reduce_sum(mine, n * C);
        }
        d = mine;
    }
    if (spec_.arch == Arch::gpt2) {
        k::layernorm_backward(dres_.f32(), G(w), G(b), d, in, P(w), act(mean), act(rstd), n, C);
    } else {
        k::rmsnorm_backward(dres_.f32(), G(w), d, in, P(w), act(rstd), n, C);
    }
}

void Transformer::row_parallel_output(float* out, int bias, int64_t n) {
    const int64_t C = dims_.C;
    if (shard_.tp_size > 1) {
        APIARY_PROFILE("tensor-parallel communication");
        if (shard_.sequence_parallel) {
            tp_->reduce_scatter_rows(partial_.f32(), out, n, C);
        } else {
            tp_->all_reduce_sum(out, n * C);
        }
    }
    if (bias >= 0) k::add_bias(out, P(bias), n, C);
}

const float* Transformer::row_parallel_grad(int64_t n) {
    if (!shard_.sequence_parallel) return dres_.f32();
    APIARY_PROFILE("tensor-parallel communication");
    tp_->all_gather_rows(dres_.f32(), dfull_.f32(), n, dims_.C);
    return dfull_.f32();
}

void Transformer::attention_core_forward(const LayerActs& a, int64_t B, int64_t T) {
    APIARY_PROFILE("attention forward");
    const int64_t NH = dims_.NH, KVH = dims_.KVH, HS = dims_.HS;
    if (precision_ != Precision::bf16) {
        k::attention_forward(act(a.atty), act(a.lse), act(a.qkv), B, T, NH, KVH, HS);
    } else {
        k::attention_forward_bf16(half(a.atty_h), act(a.lse), half(a.qkv_h), B, T, NH, KVH, HS);
    }
}

void Transformer::attention_core_backward(const LayerActs& a, int64_t B, int64_t T) {
    APIARY_PROFILE("attention backward");
    const int64_t NH = dims_.NH, KVH = dims_.KVH, HS = dims_.HS;
    if (precision_ != Precision::bf16) {
        k::attention_backward(dqkv_.f32(), datty_.f32(), act(a.qkv), act(a.atty), act(a.lse), B, T,
                              NH, KVH, HS);
    } else {
        k::attention_backward_bf16(dqkv_.f32(), datty_.f32(), half(a.qkv_h), half(a.atty_h),
                                   act(a.lse), B, T, NH, KVH, HS);
    }
}

void Transformer::block_forward(int l, const LayerActs& a, const float* in, int64_t B, int64_t T) {
    APIARY_TRACE("block forward", core::trace::Kind::compute, l);
    const BlockParams& p = block_params_[size_t(l)];
    const int64_t N = B * T, n = rows(B, T), C = dims_.C, F = dims_.F, R = dims_.R(),
                  Cl = dims_.Cl(), NH = dims_.NH, KVH = dims_.KVH, HS = dims_.HS;
    const bool gpt2 = spec_.arch == Arch::gpt2, bf16 = precision_ == Precision::bf16;
    const bool tp = shard_.tp_size > 1;
    // Row-parallel matmuls write partial sums: into the output itself when
    // the all-reduce keeps all rows, else into partial_ for the scatter.
    auto row_out = [&](int64_t res) {
        return shard_.sequence_parallel ? partial_.f32() : act(res);
    };

    float* norm1 =
        norm_forward(p.ln1_w, p.ln1_b, a.norm1, a.norm1_h, a.norm1_mean, a.norm1_rstd, in, n);
    if (gpt2 && bf16) {
        // q, k, v only feed attention's bf16 products: written in bf16.
        lin_fwd_to_half(a.qkv_h, norm1, a.norm1_h, p.qkv_w, p.qkv_b, N, C, R);
    } else {
        lin_fwd(act(a.qkv), norm1, a.norm1_h, p.qkv_w, p.qkv_b, N, C, R);
    }
    if (!gpt2) {
        k::rope_apply(act(a.qkv), rope_cos_.f32(), rope_sin_.f32(), B, T, R, 0, NH, HS, false);
        k::rope_apply(act(a.qkv), rope_cos_.f32(), rope_sin_.f32(), B, T, R, NH * HS, KVH, HS,
                      false);
        // LLaMA's q, k went through RoPE in fp32: rounded once for attention.
        if (bf16) k::to_bf16(half(a.qkv_h), act(a.qkv), N * R);
    }
    attention_core_forward(a, B, T);
    lin_fwd(row_out(a.res2), bf16 ? nullptr : act(a.atty), a.atty_h, p.proj_w, tp ? -1 : p.proj_b,
            N, Cl, C);
    if (tp) row_parallel_output(act(a.res2), p.proj_b, n);
    k::add_inplace(act(a.res2), in, n * C);

    // An MoE block takes its input in fp32 (its router and experts compute
    // in fp32 in every mode, model/moe.cc).
    float* norm2 = norm_forward(p.ln2_w, p.ln2_b, a.norm2, p.moe ? -1 : a.norm2_h, a.norm2_mean,
                                a.norm2_rstd, act(a.res2), n);
    if (p.moe) {
        // Experts instead of the MLP (model/moe.cc); n == N: no tp.
        moe_forward(l, a, norm2, act(a.res3), N);
        k::add_inplace(act(a.res3), act(a.res2), n * C);
        return;
    }
    lin_fwd(act(a.fc), norm2, a.norm2_h, p.fc_w, p.fc_b, N, C, gpt2 ? F : 2 * F);
    float* fc_act = nullptr;  // bf16 gpt2: gelu writes the next matmul's bf16 input
    if (gpt2 && bf16) {
        k::gelu_forward_bf16(half(a.fc_act_h), act(a.fc), N * F);
    } else if (gpt2) {
        fc_act = act(a.fc_act);
        k::gelu_forward(fc_act, act(a.fc), N * F);
    } else {
        fc_act = act(a.fc_act);
        k::swiglu_forward(fc_act, act(a.fc), N, F);
    }
    lin_fwd(row_out(a.res3), fc_act, a.fc_act_h, p.fc2_w, tp ? -1 : p.fc2_b, N, F, C);
    if (tp) row_parallel_output(act(a.res3), p.fc2_b, n);
    k::add_inplace(act(a.res3), act(a.res2), n * C);
}

void Transformer::mlp_backward(const BlockParams& p, const LayerActs& a, int64_t N, int64_t n) {
    const int64_t C = dims_.C, F = dims_.F;
    const bool gpt2 = spec_.arch == Arch::gpt2, bf16 = precision_ == Precision::bf16;
    // The MLP. Its second matmul's bias gradient comes from all rows of dy,
    // the same on every rank.
    lin_bwd(dfc_act_.f32(), p.fc2_w, p.fc2_b, row_parallel_grad(n), act(a.fc_act), a.fc_act_h, N, F,
            C);
    const float* dfc = dfc_.f32();
    if (gpt2 && bf16) {
        // The gradient goes straight to the matmul's bf16 operand, its bias
        // gradient summed on the way (lin_bwd takes dy = null).
        k::gelu_backward_bf16(grad_half_.data<uint16_t>(), G(p.fc_b), act(a.fc), dfc_act_.f32(), N,
                              F);
        dfc = nullptr;
    } else if (gpt2) {
        k::gelu_backward(dfc_.f32(), act(a.fc), dfc_act_.f32(), N * F);
    } else {
        k::swiglu_backward(dfc_.f32(), dfc_act_.f32(), act(a.fc), N, F);
    }
    lin_bwd(dnorm_.f32(), p.fc_w, p.fc_b, dfc, act(a.norm2), a.norm2_h, N, C, gpt2 ? F : 2 * F);
}

void Transformer::block_backward(int l, const LayerActs& a, const float* in, int64_t B, int64_t T) {
    APIARY_TRACE("block backward", core::trace::Kind::compute, l);
    const BlockParams& p = block_params_[size_t(l)];
    const int64_t N = B * T, n = rows(B, T), C = dims_.C, R = dims_.R(),
                  Cl = dims_.Cl(), NH = dims_.NH, KVH = dims_.KVH, HS = dims_.HS;
    const bool gpt2 = spec_.arch == Arch::gpt2;
    if (shard_.recompute == core::Recompute::full) {
        APIARY_PROFILE("recompute");
        block_forward(l, a, in, B, T);
    }
    if (p.moe) {
        moe_backward(l, a, act(a.norm2), dres_.f32(), N);
    } else {
        mlp_backward(p, a, N, n);
    }
    norm_backward(p.ln2_w, p.ln2_b, dnorm_.f32(), act(a.res2), a.norm2_mean, a.norm2_rstd, n);

    // Attention.
    if (shard_.recompute == core::Recompute::selective) {
        APIARY_PROFILE("recompute");
        attention_core_forward(a, B, T);
    }
    lin_bwd(datty_.f32(), p.proj_w, p.proj_b, row_parallel_grad(n), act(a.atty), a.atty_h, N, Cl,
            C);
    attention_core_backward(a, B, T);
    if (!gpt2) {
        // The rotation's transpose carries the gradient back to pre-RoPE q, k.
        k::rope_apply(dqkv_.f32(), rope_cos_.f32(), rope_sin_.f32(), B, T, R, 0, NH, HS, true);
        k::rope_apply(dqkv_.f32(), rope_cos_.f32(), rope_sin_.f32(), B, T, R, NH * HS, KVH, HS,
                      true);
    }
    lin_bwd(dnorm_.f32(), p.qkv_w, p.qkv_b, dqkv_.f32(), act(a.norm1), a.norm1_h, N, C, R);
    norm_backward(p.ln1_w, p.ln1_b, dnorm_.f32(), in, a.norm1_mean, a.norm1_rstd, n);
}

}  // namespace apiary::model
