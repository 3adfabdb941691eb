// The forward and backward passes of the transformer blocks. Each block's
// backward reads the gradient of its output from dres_ and leaves there the
// gradient of its input: the residual stream's gradient flows through one
// buffer, and each norm's backward adds its branch into it.

#include <fmt/format.h>

#include <vector>

#include "core/error.h"
#include "core/profile.h"
#include "kernels/kernels.h"
#include "model/model.h"

namespace apiary::model {

namespace k = apiary::kernels;
using core::Arch;

namespace {

void add_to(float* y, const float* x, int64_t n) { k::add_inplace(y, x, n); }

}  // namespace

void Transformer::forward_body(const int32_t* tokens, int64_t B, int64_t T) {
    // Activations are sized by tokens (max_B * max_T): a curriculum may trade
    // rows for length, e.g. (4B, T/4), within that.
    APIARY_CHECK(B >= 1 && T >= 1 && T <= max_T_ && B * T <= max_B_ * max_T_,
                 "micro-batch (B={}, T={}) exceeds the allocated (B={}, T={})", B, T, max_B_,
                 max_T_);
    const int64_t C = spec_.n_embd, V = spec_.vocab_size;
    refresh_shadow();
    for (int64_t i = 0; i < B * T; ++i) {
        if (tokens[i] < 0 || tokens[i] >= V) {
            throw DataError(fmt::format("token id {} at position {} is outside the vocabulary "
                                        "(model.vocab_size = {})",
                                        tokens[i], i, V));
        }
    }
    // Under ZeRO-3 each unit is gathered just before use, the next one is
    // prefetched, and a block is released once done; the embedding and final
    // units stay resident for the whole pass (the head may be tied).
    const int L = spec_.n_layer;
    use_params(0, L > 0 ? 1 : post_unit());
    if (spec_.arch == Arch::gpt2) {
        k::embedding_forward(act(encoded_), tokens, param("wte.weight"), param("wpe.weight"), B, T,
                             C);
    } else {
        k::embedding_forward(act(encoded_), tokens, param("model.embed_tokens.weight"), nullptr, B,
                             T, C);
    }
    for (int l = 0; l < L; ++l) {
        use_params(l + 1, l + 1 < L ? l + 2 : post_unit());
        block_forward(l, B, T);
        drop_params(l + 1);
    }
    use_params(post_unit(), -1);
    const float* last = act(layer_.back().res3);
    const int64_t N = B * T;
    if (spec_.arch == Arch::gpt2) {
        k::layernorm_forward(act(lnf_), act(lnf_mean_), act(lnf_rstd_), last, param("ln_f.weight"),
                             param("ln_f.bias"), N, C, spec_.norm_eps);
    } else {
        k::rmsnorm_forward(act(lnf_), act(lnf_rstd_), last, param("model.norm.weight"), N, C,
                           spec_.norm_eps);
    }
}

float* Transformer::layernorm_fwd(int64_t out, int64_t out_half, int64_t mean, int64_t rstd,
                                  const float* in, const std::string& prefix, int64_t N) {
    const int64_t C = spec_.n_embd;
    const float* w = param(prefix + "weight");
    const float* b = param(prefix + "bias");
    if (precision_ == Precision::bf16) {
        k::layernorm_forward_bf16(half(out_half), act(mean), act(rstd), in, w, b, N, C,
                                  spec_.norm_eps);
        return nullptr;
    }
    k::layernorm_forward(act(out), act(mean), act(rstd), in, w, b, N, C, spec_.norm_eps);
    return act(out);
}

float* Transformer::attention_fwd(LayerOffsets& a, int64_t B, int64_t T) {
    APIARY_PROFILE("attention forward");
    const int64_t NH = spec_.n_head, KVH = spec_.n_kv_head, HS = spec_.head_size(),
                  R = spec_.n_embd + 2 * spec_.kv_dim();
    if (precision_ != Precision::bf16) {
        k::attention_forward(act(a.atty), act(a.lse), act(a.qkv), B, T, NH, KVH, HS);
        return act(a.atty);
    }
    // q, k, v rounded once (GPT-2's qkv matmul wrote them in bf16 already;
    // LLaMA's went through RoPE in fp32); the output lands in bf16 as the
    // next matmul's input.
    if (spec_.arch != Arch::gpt2) k::to_bf16(half(a.qkv_h), act(a.qkv), B * T * R);
    k::attention_forward_bf16(half(a.atty_h), act(a.lse), half(a.qkv_h), B, T, NH, KVH, HS);
    return nullptr;
}

void Transformer::attention_bwd(LayerOffsets& a, int64_t B, int64_t T) {
    APIARY_PROFILE("attention backward");
    const int64_t NH = spec_.n_head, KVH = spec_.n_kv_head, HS = spec_.head_size();
    if (precision_ != Precision::bf16) {
        k::attention_backward(dqkv_.f32(), datty_.f32(), act(a.qkv), act(a.atty), act(a.lse), B,
                              T, NH, KVH, HS);
    } else {
        k::attention_backward_bf16(dqkv_.f32(), datty_.f32(), half(a.qkv_h), half(a.atty_h),
                                   act(a.lse), B, T, NH, KVH, HS);
    }
}

void Transformer::block_forward(int l, int64_t B, int64_t T) {
    const int64_t N = B * T, C = spec_.n_embd, F = spec_.ffn_dim(), NH = spec_.n_head,
                  KVH = spec_.n_kv_head, HS = spec_.head_size(), R = C + 2 * spec_.kv_dim();
    const float eps = spec_.norm_eps;
    LayerOffsets& a = layer_[l];
    const float* in = l == 0 ? act(encoded_) : act(layer_[l - 1].res3);
    if (spec_.arch == Arch::gpt2) {
        const std::string p = fmt::format("h.{}.", l);
        float* norm1 = layernorm_fwd(a.norm1, a.norm1_h, a.norm1_mean, a.norm1_rstd, in,
                                     p + "ln_1.", N);
        if (precision_ == Precision::bf16) {
            // q, k, v only feed attention's bf16 products: written in bf16.
            lin_fwd_to_half(a.qkv_h, norm1, a.norm1_h, p + "attn.c_attn.weight",
                            p + "attn.c_attn.bias", N, C, 3 * C);
        } else {
            lin_fwd(act(a.qkv), norm1, a.norm1_h, p + "attn.c_attn.weight", p + "attn.c_attn.bias",
                    N, C, 3 * C);
        }
        float* atty = attention_fwd(a, B, T);
        lin_fwd(act(a.res2), atty, a.atty_h, p + "attn.c_proj.weight", p + "attn.c_proj.bias", N,
                C, C);
        add_to(act(a.res2), in, N * C);
        float* norm2 = layernorm_fwd(a.norm2, a.norm2_h, a.norm2_mean, a.norm2_rstd, act(a.res2),
                                     p + "ln_2.", N);
        lin_fwd(act(a.fc), norm2, a.norm2_h, p + "mlp.c_fc.weight", p + "mlp.c_fc.bias", N, C, F);
        float* fc_act = nullptr;  // bf16: gelu writes the next matmul's bf16 input
        if (precision_ == Precision::bf16) {
            k::gelu_forward_bf16(half(a.fc_act_h), act(a.fc), N * F);
        } else {
            fc_act = act(a.fc_act);
            k::gelu_forward(fc_act, act(a.fc), N * F);
        }
        lin_fwd(act(a.res3), fc_act, a.fc_act_h, p + "mlp.c_proj.weight", p + "mlp.c_proj.bias",
                N, F, C);
    } else {
        const std::string p = fmt::format("model.layers.{}.", l);
        k::rmsnorm_forward(act(a.norm1), act(a.norm1_rstd), in, param(p + "input_layernorm.weight"),
                           N, C, eps);
        lin_fwd(act(a.qkv), act(a.norm1), a.norm1_h, p + "self_attn.q_proj.weight", "", N, C, R);
        k::rope_apply(act(a.qkv), rope_cos_.f32(), rope_sin_.f32(), B, T, R, 0, NH, HS, false);
        k::rope_apply(act(a.qkv), rope_cos_.f32(), rope_sin_.f32(), B, T, R, C, KVH, HS, false);
        float* atty = attention_fwd(a, B, T);
        lin_fwd(act(a.res2), atty, a.atty_h, p + "self_attn.o_proj.weight", "", N, C, C);
        add_to(act(a.res2), in, N * C);
        k::rmsnorm_forward(act(a.norm2), act(a.norm2_rstd), act(a.res2),
                           param(p + "post_attention_layernorm.weight"), N, C, eps);
        lin_fwd(act(a.fc), act(a.norm2), a.norm2_h, p + "mlp.gate_proj.weight", "", N, C, 2 * F);
        k::swiglu_forward(act(a.fc_act), act(a.fc), N, F);
        lin_fwd(act(a.res3), act(a.fc_act), a.fc_act_h, p + "mlp.down_proj.weight", "", N, F, C);
    }
    add_to(act(a.res3), act(a.res2), N * C);
}

void Transformer::block_backward(int l, int64_t B, int64_t T) {
    const int64_t N = B * T, C = spec_.n_embd, F = spec_.ffn_dim(), NH = spec_.n_head,
                  KVH = spec_.n_kv_head, HS = spec_.head_size(), R = C + 2 * spec_.kv_dim();
    LayerOffsets& a = layer_[l];
    const float* in = l == 0 ? act(encoded_) : act(layer_[l - 1].res3);
    float* dres = dres_.f32();
    if (spec_.arch == Arch::gpt2) {
        const std::string p = fmt::format("h.{}.", l);
        lin_bwd(dfc_act_.f32(), p + "mlp.c_proj.weight", p + "mlp.c_proj.bias", dres,
                act(a.fc_act), a.fc_act_h, N, F, C);
        const float* dfc = dfc_.f32();
        if (precision_ == Precision::bf16) {
            // The gradient goes straight to the matmul's bf16 operand, its
            // bias gradient summed on the way (lin_bwd takes dy = null).
            k::gelu_backward_bf16(grad_half_.data<uint16_t>(), grad(p + "mlp.c_fc.bias"),
                                  act(a.fc), dfc_act_.f32(), N, F);
            dfc = nullptr;
        } else {
            k::gelu_backward(dfc_.f32(), act(a.fc), dfc_act_.f32(), N * F);
        }
        lin_bwd(dnorm_.f32(), p + "mlp.c_fc.weight", p + "mlp.c_fc.bias", dfc, act(a.norm2),
                a.norm2_h, N, C, F);
        k::layernorm_backward(dres, grad(p + "ln_2.weight"), grad(p + "ln_2.bias"), dnorm_.f32(),
                              act(a.res2), param(p + "ln_2.weight"), act(a.norm2_mean),
                              act(a.norm2_rstd), N, C);
        lin_bwd(datty_.f32(), p + "attn.c_proj.weight", p + "attn.c_proj.bias", dres, act(a.atty),
                a.atty_h, N, C, C);
        attention_bwd(a, B, T);
        lin_bwd(dnorm_.f32(), p + "attn.c_attn.weight", p + "attn.c_attn.bias", dqkv_.f32(),
                act(a.norm1), a.norm1_h, N, C, 3 * C);
        k::layernorm_backward(dres, grad(p + "ln_1.weight"), grad(p + "ln_1.bias"), dnorm_.f32(),
                              in, param(p + "ln_1.weight"), act(a.norm1_mean), act(a.norm1_rstd),
                              N, C);
    } else {
        const std::string p = fmt::format("model.layers.{}.", l);
        lin_bwd(dfc_act_.f32(), p + "mlp.down_proj.weight", "", dres, act(a.fc_act), a.fc_act_h, N,
                F, C);
        k::swiglu_backward(dfc_.f32(), dfc_act_.f32(), act(a.fc), N, F);
        lin_bwd(dnorm_.f32(), p + "mlp.gate_proj.weight", "", dfc_.f32(), act(a.norm2), a.norm2_h,
                N, C, 2 * F);
        k::rmsnorm_backward(dres, grad(p + "post_attention_layernorm.weight"), dnorm_.f32(),
                            act(a.res2), param(p + "post_attention_layernorm.weight"),
                            act(a.norm2_rstd), N, C);
        lin_bwd(datty_.f32(), p + "self_attn.o_proj.weight", "", dres, act(a.atty), a.atty_h, N, C,
                C);
        attention_bwd(a, B, T);
        // The rotation's transpose carries the gradient back to pre-RoPE q, k.
        k::rope_apply(dqkv_.f32(), rope_cos_.f32(), rope_sin_.f32(), B, T, R, 0, NH, HS, true);
        k::rope_apply(dqkv_.f32(), rope_cos_.f32(), rope_sin_.f32(), B, T, R, C, KVH, HS, true);
        lin_bwd(dnorm_.f32(), p + "self_attn.q_proj.weight", "", dqkv_.f32(), act(a.norm1),
                a.norm1_h, N, C, R);
        k::rmsnorm_backward(dres, grad(p + "input_layernorm.weight"), dnorm_.f32(), in,
                            param(p + "input_layernorm.weight"), act(a.norm1_rstd), N, C);
    }
}

void Transformer::backward_body(const int32_t* tokens, int64_t B, int64_t T) {
    // On entry dnorm_ holds the gradient of the final norm's output.
    const int64_t N = B * T, C = spec_.n_embd;
    dres_.zero();
    const float* last = act(layer_.back().res3);
    if (spec_.arch == Arch::gpt2) {
        k::layernorm_backward(dres_.f32(), grad("ln_f.weight"), grad("ln_f.bias"), dnorm_.f32(),
                              last, param("ln_f.weight"), act(lnf_mean_), act(lnf_rstd_), N, C);
    } else {
        k::rmsnorm_backward(dres_.f32(), grad("model.norm.weight"), dnorm_.f32(), last,
                            param("model.norm.weight"), act(lnf_rstd_), N, C);
    }
    // Everything from the final norm on is complete (a tied head's gradient
    // lands in the embedding, at offset 0, which is reported last).
    const auto& entries = registry_.entries();
    auto first_of_layer = [&](int l) {
        for (const auto& e : entries) {
            if (e.layer == l) return e.offset;
        }
        return int64_t(0);
    };
    done_grads(post_unit());
    if (grad_ready_) {
        grad_ready_(registry_.get(spec_.arch == Arch::gpt2 ? "ln_f.weight" : "model.norm.weight")
                        .offset);
    }
    for (int l = spec_.n_layer - 1; l >= 0; --l) {
        use_params(l + 1, l > 0 ? l : -1);
        use_grads(l + 1);
        block_backward(l, B, T);
        done_grads(l + 1);
        drop_params(l + 1);
        if (grad_ready_) grad_ready_(first_of_layer(l));
    }
    if (spec_.arch == Arch::gpt2) {
        k::embedding_backward(grad("wte.weight"), grad("wpe.weight"), dres_.f32(), tokens, B, T, C);
    } else {
        k::embedding_backward(grad("model.embed_tokens.weight"), nullptr, dres_.f32(), tokens, B,
                              T, C);
    }
    done_grads(0);
    if (grad_ready_) grad_ready_(0);
}

LossResult Transformer::forward_backward(const int32_t* tokens, const int32_t* targets, int64_t B,
                                         int64_t T, float grad_scale) {
    forward_body(tokens, B, T);
    const int64_t N = B * T;
    LossResult r;
    // The head writes into the embedding's gradients (tied) or the final
    // unit's; both stay lent until backward is through with them.
    use_grads(0);
    use_grads(post_unit());
    r.loss_sum = head_forward_backward(targets, N, grad_scale, &r.count);
    backward_body(tokens, B, T);
    end_pass();
    return r;
}

LossResult Transformer::evaluate(const int32_t* tokens, const int32_t* targets, int64_t B,
                                 int64_t T) {
    forward_body(tokens, B, T);
    const int64_t N = B * T;
    std::vector<float> lse(static_cast<size_t>(N)), target_logit(static_cast<size_t>(N));
    k::lm_head_logsumexp(lse.data(), target_logit.data(), act(lnf_), head_weight(), targets, N,
                         spec_.n_embd, spec_.vocab_size, 8192);
    end_pass();
    LossResult r;
    for (int64_t i = 0; i < N; ++i) {
        if (targets[i] < 0) continue;
        r.loss_sum += double(lse[i]) - double(target_logit[i]);
        r.count += 1;
    }
    return r;
}

void Transformer::forward_logits(float* logits, const int32_t* tokens, int64_t B, int64_t T) {
    forward_body(tokens, B, T);
    const int64_t C = spec_.n_embd, V = spec_.vocab_size;
    k::gemm(false, true, B * T, V, C, act(lnf_), C, head_weight(), C, 0.0f, logits, V);
    end_pass();
}

void Transformer::last_logits(float* logits, const int32_t* tokens, int64_t T) {
    forward_body(tokens, 1, T);
    const int64_t C = spec_.n_embd, V = spec_.vocab_size;
    k::gemm(false, true, 1, V, C, act(lnf_) + (T - 1) * C, C, head_weight(), C, 0.0f, logits, V);
    end_pass();
}

}  // namespace apiary::model
