#include "model/model.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/profile.h"
#include "core/rng.h"
#include "kernels/kernels.h"

namespace apiary::model {

namespace k = apiary::kernels;
using core::Arch;
using core::DType;
using core::MemCategory;

Precision parse_precision(const std::string& name) {
    if (name == "fp32") return Precision::fp32;
    if (name == "bf16") return Precision::bf16;
    if (name == "fp16") return Precision::fp16;
    throw ConfigError(fmt::format("train.precision: unknown precision '{}' (known: fp32, bf16, "
                                  "fp16)",
                                  name));
}

Transformer::Transformer(const core::ModelSpec& spec, int64_t max_B, int64_t max_T,
                         Precision precision, int64_t flat_multiple, Storage storage)
    : spec_(spec), max_B_(max_B), max_T_(max_T), precision_(precision), storage_(storage) {
    spec_.validate();
    if (max_T > spec_.max_seq_len) {
        throw ConfigError(fmt::format("train.seq_len = {} exceeds model.max_seq_len = {}", max_T,
                                      spec_.max_seq_len));
    }
    APIARY_CHECK(max_B >= 1 && max_T >= 1, "bad activation shape B={} T={}", max_B, max_T);
    APIARY_CHECK(flat_multiple >= 1, "flat_multiple {} must be positive", flat_multiple);
    if (storage_ == Storage::sharded && precision_ == Precision::fp16) {
        throw ConfigError("sharded parameters (ZeRO stage 3) take train.precision = fp32 or bf16; "
                          "the emulated fp16 weight copy is made for the whole flat buffer at "
                          "once");
    }
    build_registry(flat_multiple);
    flat_size_ = registry_.total();
    const int n_units = spec_.n_layer + 2;
    pbase_.assign(size_t(n_units), nullptr);
    gbase_.assign(size_t(n_units), nullptr);
    hbase_.assign(size_t(n_units), nullptr);
    if (storage_ != Storage::sharded) {
        params_ = core::Tensor({flat_size_}, DType::f32, MemCategory::params);
        for (int u = 0; u < n_units; ++u) pbase_[size_t(u)] = params_.f32() + units_[size_t(u)].begin;
    }
    if (storage_ == Storage::full) {
        grads_ = core::Tensor({flat_size_}, DType::f32, MemCategory::grads);
        for (int u = 0; u < n_units; ++u) gbase_[size_t(u)] = grads_.f32() + units_[size_t(u)].begin;
    }
    if (precision_ == Precision::bf16 && storage_ != Storage::sharded) {
        shadow_ = core::Tensor({flat_size_}, DType::bf16, MemCategory::params);
        for (int u = 0; u < n_units; ++u) {
            hbase_[size_t(u)] = shadow_.data<uint16_t>() + units_[size_t(u)].begin;
        }
    } else if (precision_ == Precision::fp16) {
        shadow_ = core::Tensor({flat_size_}, DType::f32, MemCategory::params);
    }
    allocate_activations();
}

void Transformer::build_registry(int64_t flat_multiple) {
    const int64_t C = spec_.n_embd, V = spec_.vocab_size, F = spec_.ffn_dim(),
                  KV = spec_.kv_dim();
    auto& r = registry_;
    if (spec_.arch == Arch::gpt2) {
        r.add("wte.weight", {V, C}, true, -1);
        r.add("wpe.weight", {spec_.max_seq_len, C}, true, -1);
        r.align(flat_multiple);
        for (int l = 0; l < spec_.n_layer; ++l) {
            const std::string p = fmt::format("h.{}.", l);
            r.add(p + "ln_1.weight", {C}, false, l);
            r.add(p + "ln_1.bias", {C}, false, l);
            r.add(p + "attn.c_attn.weight", {3 * C, C}, true, l);
            r.add(p + "attn.c_attn.bias", {3 * C}, false, l);
            r.add(p + "attn.c_proj.weight", {C, C}, true, l);
            r.add(p + "attn.c_proj.bias", {C}, false, l);
            r.add(p + "ln_2.weight", {C}, false, l);
            r.add(p + "ln_2.bias", {C}, false, l);
            r.add(p + "mlp.c_fc.weight", {F, C}, true, l);
            r.add(p + "mlp.c_fc.bias", {F}, false, l);
            r.add(p + "mlp.c_proj.weight", {C, F}, true, l);
            r.add(p + "mlp.c_proj.bias", {C}, false, l);
            r.align(flat_multiple);
        }
        r.add("ln_f.weight", {C}, false, -1);
        r.add("ln_f.bias", {C}, false, -1);
    } else {
        r.add("model.embed_tokens.weight", {V, C}, true, -1);
        r.align(flat_multiple);
        for (int l = 0; l < spec_.n_layer; ++l) {
            const std::string p = fmt::format("model.layers.{}.", l);
            r.add(p + "input_layernorm.weight", {C}, false, l);
            // q, k, v back to back: one (C + 2 KV, C) matrix for a fused matmul.
            r.add(p + "self_attn.q_proj.weight", {C, C}, true, l, false);
            r.add(p + "self_attn.k_proj.weight", {KV, C}, true, l, false);
            r.add(p + "self_attn.v_proj.weight", {KV, C}, true, l);
            r.add(p + "self_attn.o_proj.weight", {C, C}, true, l);
            r.add(p + "post_attention_layernorm.weight", {C}, false, l);
            // gate and up back to back: one (2F, C) matrix.
            r.add(p + "mlp.gate_proj.weight", {F, C}, true, l, false);
            r.add(p + "mlp.up_proj.weight", {F, C}, true, l);
            r.add(p + "mlp.down_proj.weight", {C, F}, true, l);
            r.align(flat_multiple);
        }
        r.add("model.norm.weight", {C}, false, -1);
    }
    if (!spec_.tie_embeddings) r.add("lm_head.weight", {V, C}, true, -1);
    r.align(flat_multiple);
    // Units: the entries before the first block, each block, the rest.
    const int L = spec_.n_layer;
    units_.assign(size_t(L + 2), Unit{});
    unit_of_entry_.clear();
    bool after_blocks = false;
    for (const auto& e : r.entries()) {
        int u = e.layer + 1;
        if (e.layer >= 0) after_blocks = true;
        if (e.layer < 0 && after_blocks) u = L + 1;
        unit_of_entry_.push_back(u);
    }
    // Each unit runs from its first entry to the next unit's first entry.
    std::vector<int64_t> first(size_t(L + 2), -1);
    for (size_t i = 0; i < r.entries().size(); ++i) {
        auto& f = first[size_t(unit_of_entry_[i])];
        if (f < 0) f = r.entries()[i].offset;
    }
    int64_t end = r.total();
    for (int u = L + 1; u >= 0; --u) {
        const int64_t begin = first[size_t(u)] < 0 ? end : first[size_t(u)];
        units_[size_t(u)] = {begin, end};
        end = begin;
    }
}

const float* Transformer::param(const std::string& name) const {
    const ParamInfo& e = registry_.get(name);
    const int u = unit_of(e);
    const float* base = pbase_[size_t(u)];
    APIARY_CHECK(base != nullptr, "parameters of unit {} ('{}') are not resident", u, name);
    return base + (e.offset - units_[size_t(u)].begin);
}

float* Transformer::grad(const std::string& name) {
    const ParamInfo& e = registry_.get(name);
    const int u = unit_of(e);
    float* base = gbase_[size_t(u)];
    APIARY_CHECK(base != nullptr, "gradients of unit {} ('{}') are not resident", u, name);
    return base + (e.offset - units_[size_t(u)].begin);
}

const uint16_t* Transformer::wh(const std::string& name) const {
    const ParamInfo& e = registry_.get(name);
    const int u = unit_of(e);
    const uint16_t* base = hbase_[size_t(u)];
    APIARY_CHECK(base != nullptr, "bf16 weights of unit {} ('{}') are not resident", u, name);
    return base + (e.offset - units_[size_t(u)].begin);
}

void Transformer::use_params(int u, int next) {
    if (storage_ != Storage::sharded) return;
    APIARY_CHECK(store_ != nullptr, "sharded parameters without a unit store");
    pbase_[size_t(u)] = store_->acquire_params(u, next);
    if (precision_ == Precision::bf16) hbase_[size_t(u)] = store_->params_bf16(u);
}

void Transformer::drop_params(int u) {
    if (storage_ != Storage::sharded || pbase_[size_t(u)] == nullptr) return;
    store_->release_params(u);
    pbase_[size_t(u)] = nullptr;
    hbase_[size_t(u)] = nullptr;
}

void Transformer::use_grads(int u) {
    if (storage_ == Storage::full) return;
    APIARY_CHECK(store_ != nullptr, "sharded gradients without a unit store");
    gbase_[size_t(u)] = store_->acquire_grads(u);
}

void Transformer::done_grads(int u) {
    if (storage_ == Storage::full || gbase_[size_t(u)] == nullptr) return;
    store_->release_grads(u);
    gbase_[size_t(u)] = nullptr;
}

void Transformer::end_pass() {
    drop_params(0);
    drop_params(post_unit());
}

void Transformer::allocate_activations() {
    const int64_t N = max_B_ * max_T_, C = spec_.n_embd, F = spec_.ffn_dim(),
                  NH = spec_.n_head, R = C + 2 * spec_.kv_dim();
    const bool gpt2 = spec_.arch == Arch::gpt2;
    // The MLP's first matmul is (N, F) for gpt2 and (N, 2F) for SwiGLU.
    const int64_t fc_width = gpt2 ? F : 2 * F;
    int64_t cursor = 0;
    auto take = [&](int64_t n) {
        const int64_t at = cursor;
        cursor += (n + 15) / 16 * 16;
        return at;
    };
    const bool bf16 = precision_ == Precision::bf16;
    encoded_ = take(N * C);
    // In bf16 mode the fp32 norm outputs and MLP activation are only read by
    // the next matmul, which keeps its own bf16 copy: they share one
    // transient region instead of one per block. Likewise the fp32 qkv,
    // which attention reads only as its bf16 copy, and the attention output,
    // which attention writes in bf16 directly.
    const int64_t transient = bf16 ? take(N * std::max(C, F)) : 0;
    const int64_t transient_qkv = bf16 ? take(N * R) : 0;
    int64_t half_cursor = 0;
    auto take_half = [&](int64_t n) {
        const int64_t at = half_cursor;
        half_cursor += (n + 31) / 32 * 32;
        return at;
    };
    layer_.resize(spec_.n_layer);
    for (auto& a : layer_) {
        a.norm1 = bf16 ? transient : take(N * C);
        a.norm1_mean = take(N);
        a.norm1_rstd = take(N);
        a.qkv = bf16 ? transient_qkv : take(N * R);
        a.atty = bf16 ? transient : take(N * C);  // unused in bf16: atty_h holds it
        a.lse = take(max_B_ * NH * max_T_);
        a.res2 = take(N * C);
        a.norm2 = bf16 ? transient : take(N * C);
        a.norm2_mean = take(N);
        a.norm2_rstd = take(N);
        a.fc = take(N * fc_width);
        a.fc_act = bf16 ? transient : take(N * F);
        a.res3 = take(N * C);
        if (bf16) {
            a.norm1_h = take_half(N * C);
            a.qkv_h = take_half(N * R);
            a.atty_h = take_half(N * C);
            a.norm2_h = take_half(N * C);
            a.fc_act_h = take_half(N * F);
        }
    }
    lnf_ = take(N * C);
    lnf_mean_ = take(N);
    lnf_rstd_ = take(N);
    if (bf16) lnf_h_ = take_half(N * C);
    arena_ = core::Tensor({cursor}, DType::f32, MemCategory::activations);
    const int64_t widest = std::max({R, fc_width, C, F});
    if (bf16) {
        arena_half_ = core::Tensor({half_cursor}, DType::bf16, MemCategory::activations);
        grad_half_ = core::Tensor({N * widest}, DType::bf16, MemCategory::buffers);
        head_scratch_half_ = core::Tensor({k::lm_head_scratch_bf16(N, spec_.vocab_size)},
                                          DType::bf16, MemCategory::buffers);
    } else if (precision_ == Precision::fp16) {
        grad_half_ = core::Tensor({N * widest}, DType::f32, MemCategory::buffers);
    }

    dres_ = core::Tensor({N, C}, DType::f32, MemCategory::buffers);
    dnorm_ = core::Tensor({N, C}, DType::f32, MemCategory::buffers);
    dqkv_ = core::Tensor({N, R}, DType::f32, MemCategory::buffers);
    datty_ = core::Tensor({N, C}, DType::f32, MemCategory::buffers);
    dfc_ = core::Tensor({N, fc_width}, DType::f32, MemCategory::buffers);
    dfc_act_ = core::Tensor({N, F}, DType::f32, MemCategory::buffers);
    head_scratch_ = core::Tensor({k::lm_head_scratch_floats(N, spec_.vocab_size)}, DType::f32,
                                 MemCategory::buffers);
    if (!gpt2) {
        const int64_t half = spec_.head_size() / 2;
        rope_cos_ = core::Tensor({max_T_, half}, DType::f32, MemCategory::buffers);
        rope_sin_ = core::Tensor({max_T_, half}, DType::f32, MemCategory::buffers);
        k::rope_tables(rope_cos_.f32(), rope_sin_.f32(), max_T_, spec_.head_size(),
                       spec_.rope_theta);
    }
}

void Transformer::init(uint64_t seed) { init_into(seed, params()); }

void Transformer::init_into(uint64_t seed, float* p) const {
    std::memset(p, 0, size_t(flat_size()) * sizeof(float));
    const float std_resid = 0.02f / std::sqrt(2.0f * float(spec_.n_layer));
    for (const auto& e : registry_.entries()) {
        float* dst = p + e.offset;
        const int64_t n = e.numel();
        const bool is_norm = e.name.find("ln_") != std::string::npos ||
                             e.name.find("layernorm") != std::string::npos ||
                             e.name.find("norm.weight") != std::string::npos;
        const bool is_bias = e.shape.size() == 1 && !is_norm;
        if (is_norm && e.name.ends_with(".bias")) continue;  // LayerNorm bias: 0
        if (is_norm) {
            for (int64_t i = 0; i < n; ++i) dst[i] = 1.0f;
            continue;
        }
        if (is_bias) continue;
        const bool resid = e.name.ends_with("c_proj.weight") || e.name.ends_with("o_proj.weight") ||
                           e.name.ends_with("down_proj.weight");
        const float std = resid ? std_resid : 0.02f;
        // The stream is a hash of the name: layout-independent initialisation.
        const core::Philox rng(seed, XXH64(e.name.data(), e.name.size(), 0));
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; ++i) dst[i] = rng.normal(uint64_t(i)) * std;
    }
}

void Transformer::zero_grads() {
    APIARY_PROFILE("zero grads");
    if (grads_.numel() > 0) grads_.zero();
}

const std::string& Transformer::head_name() const {
    static const std::string wte = "wte.weight", embed = "model.embed_tokens.weight",
                             head = "lm_head.weight";
    if (!spec_.tie_embeddings) return head;
    return spec_.arch == Arch::gpt2 ? wte : embed;
}

const float* Transformer::head_weight() const { return param(head_name()); }

float* Transformer::head_grad() { return grad(head_name()); }

void Transformer::refresh_shadow() {
    // Under Storage::sharded the store makes the copy of each unit it lends.
    if (!shadow_stale_ || precision_ == Precision::fp32 || storage_ == Storage::sharded) return;
    APIARY_PROFILE("weight cast");
    if (precision_ == Precision::bf16) {
        k::to_bf16(shadow_.data<uint16_t>(), params_.f32(), flat_size_);
    } else {
        k::copy_round_to_f16(shadow_.f32(), params_.f32(), flat_size_);
    }
    shadow_stale_ = false;
}

void Transformer::lin_fwd(float* y, float* x, int64_t x_half, const std::string& w,
                          const std::string& b, int64_t N, int64_t IN, int64_t OUT) {
    APIARY_PROFILE("matmul forward");
    const float* bias = b.empty() ? nullptr : param(b);
    switch (precision_) {
        case Precision::fp32:
            k::linear_forward(y, x, param(w), bias, N, IN, OUT);
            break;
        case Precision::bf16:
            if (x) k::to_bf16(half(x_half), x, N * IN);
            k::linear_forward_bf16(y, half(x_half), wh(w), bias, N, IN, OUT);
            break;
        case Precision::fp16:
            k::round_to_f16(x, N * IN);  // the saved input is the fp16 value
            k::linear_forward(y, x, shadow_.f32() + registry_.get(w).offset, bias, N, IN, OUT);
            break;
    }
}

void Transformer::lin_fwd_to_half(int64_t y_half, float* x, int64_t x_half, const std::string& w,
                                  const std::string& b, int64_t N, int64_t IN, int64_t OUT) {
    APIARY_PROFILE("matmul forward");
    APIARY_CHECK(precision_ == Precision::bf16, "lin_fwd_to_half is for bf16 mode");
    if (x) k::to_bf16(half(x_half), x, N * IN);
    k::linear_forward_bf16_out(half(y_half), half(x_half), wh(w), b.empty() ? nullptr : param(b), N,
                               IN, OUT);
}

void Transformer::lin_bwd(float* dx, const std::string& w, const std::string& b, const float* dy,
                          const float* x, int64_t x_half, int64_t N, int64_t IN, int64_t OUT) {
    APIARY_PROFILE("matmul backward");
    float* dbias = b.empty() ? nullptr : grad(b);
    switch (precision_) {
        case Precision::fp32:
            k::linear_backward(dx, grad(w), dbias, dy, x, param(w), N, IN, OUT);
            break;
        case Precision::bf16: {
            // One pass over dy: its bf16 copy and the bias gradient.
            uint16_t* dyh = grad_half_.data<uint16_t>();
            if (dy) k::to_bf16_column_sums(dyh, dbias, dy, N, OUT);
            k::linear_backward_bf16(dx, grad(w), dyh, half(x_half), wh(w), N, IN, OUT);
            break;
        }
        case Precision::fp16: {
            // The incoming gradient as an fp16 tensor would hold it: an
            // overflow here is what the loss scaler must catch.
            float* dyq = grad_half_.f32();
            k::copy_round_to_f16(dyq, dy, N * OUT);
            k::linear_backward(dx, grad(w), dbias, dyq, x, shadow_.f32() + registry_.get(w).offset,
                               N, IN, OUT);
            break;
        }
    }
}

double Transformer::head_forward_backward(const int32_t* targets, int64_t N, float grad_scale,
                                          int64_t* count) {
    APIARY_PROFILE("lm head + cross-entropy");
    const int64_t C = spec_.n_embd, V = spec_.vocab_size;
    switch (precision_) {
        case Precision::bf16:
            k::to_bf16(half(lnf_h_), act(lnf_), N * C);
            return k::lm_head_cross_entropy_bf16(
                half(lnf_h_), wh(head_name()), targets, N, C, V, grad_scale, dnorm_.f32(),
                head_grad(), count, head_scratch_.f32(), head_scratch_.numel(),
                head_scratch_half_.data<uint16_t>());
        case Precision::fp16:
            k::round_to_f16(act(lnf_), N * C);
            return k::lm_head_cross_entropy(act(lnf_),
                                            shadow_.f32() + registry_.get(head_name()).offset,
                                            targets, N, C, V, grad_scale, dnorm_.f32(),
                                            head_grad(), count, head_scratch_.f32(),
                                            head_scratch_.numel());
        case Precision::fp32:
        default:
            return k::lm_head_cross_entropy(act(lnf_), head_weight(), targets, N, C, V,
                                            grad_scale, dnorm_.f32(), head_grad(), count,
                                            head_scratch_.f32(), head_scratch_.numel());
    }
}

}  // namespace apiary::model
