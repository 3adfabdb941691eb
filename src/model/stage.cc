// A shard as a pipeline stage: its activation slots, the embedding and the
// head, and forward / backward of a chunk of blocks on one micro-batch. The
// whole-model entry points (forward_backward, evaluate, logits) are the
// one-chunk, one-slot case.

#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "core/profile.h"
#include "core/trace.h"
#include "kernels/kernels.h"
#include "model/model.h"
#include "model/moe.h"

namespace apiary::model {

namespace k = apiary::kernels;
using core::Arch;
using core::DType;
using core::MemCategory;

void Transformer::allocate_activations() {
    const int tp = shard_.tp_size;
    const int64_t N = max_B_ * max_T_, n = shard_.sequence_parallel ? (N + tp - 1) / tp : N;
    const int64_t C = dims_.C, F = dims_.F, R = dims_.R(), Cl = dims_.Cl(), NH = dims_.NH;
    const bool gpt2 = spec_.arch == Arch::gpt2, bf16 = precision_ == Precision::bf16;
    // The MLP's first matmul is (N, F) for gpt2 and (N, 2F) for SwiGLU.
    const int64_t fc_width = gpt2 ? F : 2 * F;
    int64_t cursor = 0, half_cursor = 0;
    auto take = [&](int64_t count) {
        const int64_t at = cursor;
        cursor += (count + 15) / 16 * 16;
        return at;
    };
    auto take_half = [&](int64_t count) {
        const int64_t at = half_cursor;
        half_cursor += (count + 31) / 32 * 32;
        return at;
    };
    // In bf16 mode the fp32 norm outputs and MLP activation are only read by
    // the next matmul, which keeps its own bf16 copy: they share one
    // transient region instead of one per block. Likewise the fp32 qkv,
    // which attention reads only as its bf16 copy, and the attention output,
    // which attention writes in bf16 directly.
    const int64_t transient = bf16 ? take(N * std::max(C, F)) : 0;
    const int64_t transient_qkv = bf16 ? take(N * R) : 0;
    // One block's activations; `keep` says which ones this mode stores per
    // micro-batch, the others point at the shared work set.
    enum Part { always, attention_core, other };
    // An MoE block reads its normed input in fp32 in backward (its experts
    // compute in fp32 in every mode): never the transient region.
    auto layout = [&](LayerActs& a, bool shared, bool moe) {
        // What this mode keeps per micro-batch; the rest lives once, in the
        // shared work set, where backward recomputes it.
        auto kept = [&](Part part) {
            switch (shard_.recompute) {
                case core::Recompute::none:
                    return true;
                case core::Recompute::selective:
                    return part != attention_core;
                case core::Recompute::full:
                    return part == always;
            }
            return true;
        };
        auto keep = [&](Part part) { return shared ? !kept(part) : kept(part); };
        auto f32 = [&](int64_t count, Part part, int64_t work_at, int64_t transient_at) {
            if (!keep(part)) return shared ? int64_t(0) : work_at;
            return transient_at >= 0 ? transient_at : take(count);
        };
        auto bf = [&](int64_t count, Part part, int64_t work_at) {
            if (!bf16) return int64_t(0);
            if (!keep(part)) return shared ? int64_t(0) : work_at;
            return take_half(count);
        };
        const int64_t tr = bf16 ? transient : -1, trq = bf16 ? transient_qkv : -1;
        a.norm1 = f32(N * C, other, work_.norm1, tr);
        a.norm1_mean = f32(n, other, work_.norm1_mean, -1);
        a.norm1_rstd = f32(n, other, work_.norm1_rstd, -1);
        a.qkv = f32(N * R, other, work_.qkv, trq);
        a.atty = f32(N * Cl, attention_core, work_.atty, tr);
        a.lse = f32(max_B_ * NH * max_T_, attention_core, work_.lse, -1);
        a.res2 = f32(n * C, other, work_.res2, -1);
        a.norm2 = f32(N * C, other, work_.norm2, moe ? -1 : tr);
        a.norm2_mean = f32(n, other, work_.norm2_mean, -1);
        a.norm2_rstd = f32(n, other, work_.norm2_rstd, -1);
        a.fc = f32(N * fc_width, other, work_.fc, -1);
        a.fc_act = f32(N * F, other, work_.fc_act, tr);
        a.res3 = f32(n * C, always, work_.res3, -1);
        a.norm1_h = bf(N * C, other, work_.norm1_h);
        a.qkv_h = bf(N * R, other, work_.qkv_h);
        a.atty_h = bf(N * Cl, attention_core, work_.atty_h);
        a.norm2_h = bf(N * C, other, work_.norm2_h);
        a.fc_act_h = bf(N * F, other, work_.fc_act_h);
    };
    bool any_moe = false;
    for (int l : local_layers_) any_moe = any_moe || spec_.moe_layer(l);
    if (shard_.recompute != core::Recompute::none) layout(work_, true, any_moe);
    for (auto& c : chunks_) {
        c.slots.resize(size_t(shard_.slots));
        for (auto& s : c.slots) {
            s.input = take(n * C);
            s.layers.resize(c.layers.size());
            for (size_t j = 0; j < c.layers.size(); ++j) {
                layout(s.layers[j], false, spec_.moe_layer(c.layers[j]));
            }
            if (c.embedding) s.tokens.resize(size_t(N));
        }
    }
    if (shard_.head) {
        lnf_ = take(N * C);
        lnf_mean_ = take(n);
        lnf_rstd_ = take(n);
        if (bf16) lnf_h_ = take_half(N * C);
    }
    arena_ = core::Tensor({cursor}, DType::f32, MemCategory::activations);
    const int64_t widest = std::max({R, fc_width, C, F});
    const int64_t V = shard_.head ? dims_.Vl : 0;
    const bool vp = shard_.tp_size > 1;
    if (bf16) {
        arena_half_ = core::Tensor({std::max<int64_t>(half_cursor, 32)}, DType::bf16,
                                   MemCategory::activations);
        grad_half_ = core::Tensor({N * widest}, DType::bf16, MemCategory::buffers);
        if (V > 0) {
            head_scratch_half_ = core::Tensor(
                {vp ? k::lm_head_vp_scratch_floats(N, V) : k::lm_head_scratch_bf16(N, V)},
                DType::bf16, MemCategory::buffers);
        }
    } else if (precision_ == Precision::fp16) {
        grad_half_ = core::Tensor({N * widest}, DType::f32, MemCategory::buffers);
    }
    dres_ = core::Tensor({n, C}, DType::f32, MemCategory::buffers);
    dnorm_ = core::Tensor({N, C}, DType::f32, MemCategory::buffers);
    dqkv_ = core::Tensor({N, R}, DType::f32, MemCategory::buffers);
    datty_ = core::Tensor({N, Cl}, DType::f32, MemCategory::buffers);
    dfc_ = core::Tensor({N, fc_width}, DType::f32, MemCategory::buffers);
    dfc_act_ = core::Tensor({N, F}, DType::f32, MemCategory::buffers);
    if (V > 0) {
        head_scratch_ = core::Tensor(
            {vp ? k::lm_head_vp_scratch_floats(N, V) : k::lm_head_scratch_floats(N, V)}, DType::f32,
            MemCategory::buffers);
    }
    if (shard_.sequence_parallel) {
        dfull_ = core::Tensor({N, C}, DType::f32, MemCategory::buffers);
        partial_ = core::Tensor({N, C}, DType::f32, MemCategory::buffers);
    }
    if (!gpt2) {
        const int64_t hs2 = dims_.HS / 2;
        rope_cos_ = core::Tensor({max_T_, hs2}, DType::f32, MemCategory::buffers);
        rope_sin_ = core::Tensor({max_T_, hs2}, DType::f32, MemCategory::buffers);
        k::rope_tables(rope_cos_.f32(), rope_sin_.f32(), max_T_, dims_.HS, spec_.rope_theta);
    }
    allocate_moe();
}

void Transformer::check_shape(int64_t B, int64_t T) const {
    // Activations are sized by tokens (max_B * max_T): a curriculum may trade
    // rows for length, e.g. (4B, T/4), within that.
    APIARY_CHECK(B >= 1 && T >= 1 && T <= max_T_ && B * T <= max_B_ * max_T_,
                 "micro-batch (B={}, T={}) exceeds the allocated (B={}, T={})", B, T, max_B_,
                 max_T_);
    APIARY_CHECK(!shard_.sequence_parallel || (B * T) % shard_.tp_size == 0,
                 "sequence parallelism: B*T = {} rows do not split over tp = {}", B * T,
                 shard_.tp_size);
}

void Transformer::check_tokens(const int32_t* tokens, int64_t n) const {
    const int64_t V = spec_.vocab_size;
    for (int64_t i = 0; i < n; ++i) {
        if (tokens[i] < 0 || tokens[i] >= V) {
            throw DataError(
                fmt::format("token id {} at position {} is outside the vocabulary "
                            "(model.vocab_size = {})",
                            tokens[i], i, V));
        }
    }
}

void Transformer::embed_forward(SlotActs& s, const int32_t* tokens, int64_t B, int64_t T) {
    APIARY_TRACE("embedding forward", core::trace::Kind::compute);
    const int64_t N = B * T, n = rows(B, T), C = dims_.C;
    check_tokens(tokens, N);
    std::copy_n(tokens, N, s.tokens.data());
    use_params(embed_unit(), -1);
    // Each rank looks up the tokens of its vocabulary slice; the sum over
    // ranks is the embedding (all-reduced, or reduce-scattered by rows).
    float* out = act(s.input);
    float* lookup = shard_.sequence_parallel ? partial_.f32() : out;
    k::embedding_lookup(lookup, tokens, P(wte_), dims_.v0, dims_.Vl, N, C);
    if (shard_.tp_size > 1) {
        APIARY_PROFILE("tensor-parallel communication");
        if (shard_.sequence_parallel) {
            tp_->reduce_scatter_rows(lookup, out, n, C);
        } else {
            tp_->all_reduce_sum(out, N * C);
        }
    }
    if (wpe_ >= 0) {
        const int64_t row0 = shard_.sequence_parallel ? shard_.tp_rank * n : 0;
        k::add_positions(out, P(wpe_), row0, T, n, C);
    }
}

void Transformer::embed_backward(SlotActs& s) {
    APIARY_TRACE("embedding backward", core::trace::Kind::compute);
    const int64_t B = s.B, T = s.T, N = B * T, n = rows(B, T), C = dims_.C;
    const float* d = dres_.f32();
    if (wpe_ >= 0) {
        const int64_t row0 = shard_.sequence_parallel ? shard_.tp_rank * n : 0;
        k::positions_backward(G(wpe_), d, row0, T, n, C);
    }
    // Every rank's slice of the vocabulary needs every row's gradient.
    const float* full = row_parallel_grad(n);
    k::embedding_lookup_backward(G(wte_), full, s.tokens.data(), dims_.v0, dims_.Vl, N, C);
}

void Transformer::forward(int chunk, int slot, const int32_t* tokens, const float* input, int64_t B,
                          int64_t T) {
    Chunk& c = chunks_[size_t(chunk)];
    SlotActs& s = c.slots[size_t(slot)];
    check_shape(B, T);
    s.B = B;
    s.T = T;
    refresh_shadow();
    if (c.embedding) {
        embed_forward(s, tokens, B, T);
    } else {
        std::copy_n(input, rows(B, T) * dims_.C, act(s.input));
    }
    // Under ZeRO-3 each unit is gathered just before use, the next one is
    // prefetched, and a block is released once done; the embedding and final
    // units stay resident for the pass (the head may be tied).
    const float* in = act(s.input);
    for (size_t j = 0; j < c.layers.size(); ++j) {
        const int l = c.layers[j];
        const int next = j + 1 < c.layers.size() ? unit_of_layer(c.layers[j + 1]) : -1;
        use_params(unit_of_layer(l), next);
        block_forward(l, s.layers[j], in, B, T);
        drop_params(unit_of_layer(l));
        in = act(s.layers[j].res3);
    }
}

const float* Transformer::output(int chunk, int slot) {
    const SlotActs& s = chunks_[size_t(chunk)].slots[size_t(slot)];
    return s.layers.empty() ? act(s.input) : act(s.layers.back().res3);
}

LossResult Transformer::head_loss(int chunk, int slot, const int32_t* targets,
                                  const float* grad_scale) {
    APIARY_TRACE("head", core::trace::Kind::compute);
    Chunk& c = chunks_[size_t(chunk)];
    APIARY_CHECK(c.head, "head_loss on chunk {}, which has no head", chunk);
    SlotActs& s = c.slots[size_t(slot)];
    const int64_t N = s.B * s.T, n = rows(s.B, s.T);
    const float* last = output(chunk, slot);
    use_params(post_unit(), -1);
    norm_forward(lnf_w_, lnf_b_, lnf_, -1, lnf_mean_, lnf_rstd_, last, n);
    LossResult r;
    if (grad_scale) {
        moe_grad_scale_ = *grad_scale;
        // The head writes into the embedding's gradients (tied) or the final
        // unit's; both stay lent until backward is through with them.
        use_grads(embed_unit());
        use_grads(post_unit());
    }
    r.loss_sum = head_loss_sum(targets, N, grad_scale, &r.count);
    if (!grad_scale) return r;
    dres_.zero();
    norm_backward(lnf_w_, lnf_b_, dnorm_.f32(), last, lnf_mean_, lnf_rstd_, n);
    // Everything after the last block is complete (a tied head's gradient
    // lands in the embedding, at offset 0, which is reported last).
    done_grads(post_unit());
    report_ready(units_.back().begin);
    return r;
}

double Transformer::head_loss_sum(const int32_t* targets, int64_t N, const float* grad_scale,
                                  int64_t* count) {
    APIARY_PROFILE("lm head + cross-entropy");
    const int64_t C = dims_.C, V = dims_.Vl;
    const bool bf16 = precision_ == Precision::bf16;
    float* dh = grad_scale ? dnorm_.f32() : nullptr;
    float* dW = grad_scale ? G(head_w_) : nullptr;
    const float gs = grad_scale ? *grad_scale : 0.0f;
    if (shard_.tp_size > 1) {
        // Megatron's vocab-parallel cross-entropy: row max and sum of
        // exponentials combined over the ranks' slices.
        k::VocabHead h;
        if (bf16) {
            k::to_bf16(half(lnf_h_), act(lnf_), N * C);
            h.h16 = half(lnf_h_);
            h.W16 = H(head_w_);
        } else {
            if (precision_ == Precision::fp16) k::round_to_f16(act(lnf_), N * C);
            h.h = act(lnf_);
            h.W = precision_ == Precision::fp16
                      ? shadow_.f32() + registry_.entries()[size_t(head_w_)].offset
                      : P(head_w_);
        }
        h.Vl = V;
        h.v0 = dims_.v0;
        k::RowReduce reduce;
        reduce.ctx = tp_;
        reduce.max = [](void* t, float* x, int64_t m) {
            static_cast<TensorParallelComm*>(t)->all_reduce_max(x, m);
        };
        reduce.sum = [](void* t, float* x, int64_t m) {
            static_cast<TensorParallelComm*>(t)->all_reduce_sum(x, m);
        };
        return k::lm_head_cross_entropy_vp(
            h, targets, N, C, gs, dh, dW, count, head_scratch_.f32(), head_scratch_.numel(),
            bf16 ? head_scratch_half_.data<uint16_t>() : nullptr, reduce);
    }
    if (!grad_scale) {
        // Evaluation streams over vocabulary chunks with an online log-sum-exp.
        std::vector<float> lse(static_cast<size_t>(N)), target_logit(static_cast<size_t>(N));
        k::lm_head_logsumexp(lse.data(), target_logit.data(), act(lnf_), P(head_w_), targets, N, C,
                             V, 8192);
        double sum = 0;
        int64_t valid = 0;
        for (int64_t i = 0; i < N; ++i) {
            if (targets[i] < 0) continue;
            sum += double(lse[size_t(i)]) - double(target_logit[size_t(i)]);
            valid += 1;
        }
        *count = valid;
        return sum;
    }
    switch (precision_) {
        case Precision::bf16:
            k::to_bf16(half(lnf_h_), act(lnf_), N * C);
            return k::lm_head_cross_entropy_bf16(
                half(lnf_h_), H(head_w_), targets, N, C, V, gs, dh, dW, count, head_scratch_.f32(),
                head_scratch_.numel(), head_scratch_half_.data<uint16_t>());
        case Precision::fp16:
            k::round_to_f16(act(lnf_), N * C);
            return k::lm_head_cross_entropy(
                act(lnf_), shadow_.f32() + registry_.entries()[size_t(head_w_)].offset, targets, N,
                C, V, gs, dh, dW, count, head_scratch_.f32(), head_scratch_.numel());
        case Precision::fp32:
        default:
            return k::lm_head_cross_entropy(act(lnf_), P(head_w_), targets, N, C, V, gs, dh, dW,
                                            count, head_scratch_.f32(), head_scratch_.numel());
    }
}

void Transformer::backward(int chunk, int slot, const float* grad_output) {
    Chunk& c = chunks_[size_t(chunk)];
    SlotActs& s = c.slots[size_t(slot)];
    const int64_t B = s.B, T = s.T;
    if (!c.head) {
        APIARY_CHECK(grad_output != nullptr, "backward of chunk {} needs its output's gradient",
                     chunk);
        std::copy_n(grad_output, rows(B, T) * dims_.C, dres_.f32());
    }
    for (size_t j = c.layers.size(); j-- > 0;) {
        const int l = c.layers[j];
        const int u = unit_of_layer(l);
        // Under expert parallelism the block's routed experts are a unit of
        // their own (-1 otherwise), lent with the block's.
        const int xu = expert_unit_[size_t(l)];
        use_params(u, j > 0 ? unit_of_layer(c.layers[j - 1]) : -1);
        use_grads(u);
        if (xu >= 0) use_grads(xu);
        const float* in = j == 0 ? act(s.input) : act(s.layers[j - 1].res3);
        block_backward(l, s.layers[j], in, B, T);
        if (xu >= 0) done_grads(xu);
        done_grads(u);
        drop_params(u);
        report_ready(units_[size_t(u)].begin);
    }
    if (c.embedding) {
        use_grads(embed_unit());
        embed_backward(s);
    }
    if (chunk == 0) {
        // Unit 0 (the embedding, or a tied copy of it) is complete last.
        done_grads(embed_unit());
        report_ready(0);
    }
}

void Transformer::end_pass() {
    drop_params(embed_unit());
    drop_params(post_unit());
}

// ---- the whole model on one rank ----

LossResult Transformer::forward_backward(const int32_t* tokens, const int32_t* targets, int64_t B,
                                         int64_t T, float grad_scale) {
    APIARY_CHECK(chunks_.size() == 1 && shard_.embedding && shard_.head,
                 "forward_backward needs the whole stack (a pipeline stage uses forward/backward)");
    forward(0, 0, tokens, nullptr, B, T);
    const LossResult r = head_loss(0, 0, targets, &grad_scale);
    backward(0, 0, nullptr);
    end_pass();
    return r;
}

LossResult Transformer::evaluate(const int32_t* tokens, const int32_t* targets, int64_t B,
                                 int64_t T) {
    forward(0, 0, tokens, nullptr, B, T);
    const LossResult r = head_loss(0, 0, targets, nullptr);
    end_pass();
    return r;
}

void Transformer::forward_logits(float* logits, const int32_t* tokens, int64_t B, int64_t T) {
    APIARY_CHECK(shard_.whole(), "forward_logits needs the whole model on one rank");
    forward(0, 0, tokens, nullptr, B, T);
    use_params(post_unit(), -1);
    const int64_t C = dims_.C, V = spec_.vocab_size, N = B * T;
    norm_forward(lnf_w_, lnf_b_, lnf_, -1, lnf_mean_, lnf_rstd_, output(0, 0), N);
    k::gemm(false, true, N, V, C, act(lnf_), C, P(head_w_), C, 0.0f, logits, V);
    end_pass();
}

void Transformer::last_logits(float* logits, const int32_t* tokens, int64_t T) {
    APIARY_CHECK(shard_.whole(), "last_logits needs the whole model on one rank");
    forward(0, 0, tokens, nullptr, 1, T);
    use_params(post_unit(), -1);
    const int64_t C = dims_.C, V = spec_.vocab_size;
    norm_forward(lnf_w_, lnf_b_, lnf_, -1, lnf_mean_, lnf_rstd_, output(0, 0), T);
    k::gemm(false, true, 1, V, C, act(lnf_) + (T - 1) * C, C, P(head_w_), C, 0.0f, logits, V);
    end_pass();
}

}  // namespace apiary::model
