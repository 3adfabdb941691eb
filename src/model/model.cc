// Construction of a Transformer shard: its parameter registry (with each
// tensor's place in the global one), units, per-block handles, activation
// slots and the matmul helpers every block uses.

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
#include "model/moe.h"

namespace apiary::model {

namespace k = apiary::kernels;
using core::Arch;
using core::DType;
using core::MemCategory;

Precision parse_precision(const std::string& name) {
    if (name == "fp32") return Precision::fp32;
    if (name == "bf16") return Precision::bf16;
    if (name == "fp16") return Precision::fp16;
    throw ConfigError(
        fmt::format("train.precision: unknown precision '{}' (known: fp32, bf16, "
                    "fp16)",
                    name));
}

namespace {

ModelOptions options_of(Precision precision, int64_t flat_multiple, Storage storage) {
    ModelOptions o;
    o.precision = precision;
    o.flat_multiple = flat_multiple;
    o.storage = storage;
    return o;
}

}  // namespace

Transformer::Transformer(const core::ModelSpec& spec, int64_t max_B, int64_t max_T,
                         Precision precision, int64_t flat_multiple, Storage storage)
    : Transformer(spec, max_B, max_T, options_of(precision, flat_multiple, storage)) {}

Transformer::Transformer(const core::ModelSpec& spec, int64_t max_B, int64_t max_T,
                         const ModelOptions& o)
    : spec_(spec),
      shard_(o.shard),
      max_B_(max_B),
      max_T_(max_T),
      precision_(o.precision),
      storage_(o.storage),
      flat_multiple_(o.flat_multiple) {
    spec_.validate();
    if (max_T > spec_.max_seq_len) {
        throw ConfigError(fmt::format("train.seq_len = {} exceeds model.max_seq_len = {}", max_T,
                                      spec_.max_seq_len));
    }
    APIARY_CHECK(max_B >= 1 && max_T >= 1, "bad activation shape B={} T={}", max_B, max_T);
    APIARY_CHECK(flat_multiple_ >= 1, "flat_multiple {} must be positive", flat_multiple_);
    APIARY_CHECK(shard_.slots >= 1, "{} activation slots", shard_.slots);
    if (storage_ == Storage::sharded && precision_ == Precision::fp16) {
        throw ConfigError(
            "sharded parameters (ZeRO stage 3) take train.precision = fp32 or bf16; "
            "the emulated fp16 weight copy is made for the whole flat buffer at "
            "once");
    }
    if (spec_.moe()) {
        // The MoE block computes in fp32 (inside a bf16 model too); the
        // emulated fp16 weight copy is not read by it: refused here too, not
        // only where the trainer validates its config.
        if (precision_ == Precision::fp16) {
            throw ConfigError(fmt::format(
                "model.n_expert = {}: mixture-of-experts blocks train in train.precision = "
                "fp32 or bf16 (not fp16)",
                spec_.n_expert));
        }
        if (shard_.tp_size > 1) {
            throw ConfigError(fmt::format(
                "model.n_expert = {}: mixture-of-experts blocks run with parallel.tp = 1 only "
                "(data, expert and pipeline parallelism, ZeRO 1-3 work)",
                spec_.n_expert));
        }
    }
    APIARY_CHECK(shard_.ep_size >= 1 && shard_.ep_rank >= 0 && shard_.ep_rank < shard_.ep_size,
                 "expert-parallel rank {} of {}", shard_.ep_rank, shard_.ep_size);
    if (shard_.ep_size > 1) {
        if (!spec_.moe() || spec_.n_expert % shard_.ep_size != 0) {
            throw ConfigError(fmt::format(
                "parallel.ep = {} needs model.n_expert to be a multiple of it (n_expert = {})",
                shard_.ep_size, spec_.n_expert));
        }
        if (storage_ == Storage::sharded) {
            throw ConfigError(fmt::format(
                "parallel.ep = {}: expert parallelism runs with parallel.zero_stage 0-2 "
                "(not yet 3)",
                shard_.ep_size));
        }
    }
    dims_ = local_dims(spec_, shard_.tp_size, shard_.tp_rank);
    if (shard_.tp_size == 1) shard_.sequence_parallel = false;
    // Chunks: the blocks of each virtual stage; the embedding goes with the
    // first, the head with the last.
    std::vector<std::vector<int>> chunks = shard_.chunks;
    if (chunks.empty()) {
        chunks.emplace_back();
        for (int l = 0; l < spec_.n_layer; ++l) chunks[0].push_back(l);
    }
    layer_unit_.assign(size_t(spec_.n_layer), -1);
    for (const auto& c : chunks) {
        for (int l : c) {
            APIARY_CHECK(l >= 0 && l < spec_.n_layer && layer_unit_[size_t(l)] < 0,
                         "block {} of {} listed twice or out of range", l, spec_.n_layer);
            layer_unit_[size_t(l)] = 0;
            local_layers_.push_back(l);
        }
    }
    std::sort(local_layers_.begin(), local_layers_.end());
    for (size_t i = 0; i < local_layers_.size(); ++i) {
        layer_unit_[size_t(local_layers_[i])] = int(i) + 1;
    }
    chunks_.resize(chunks.size());
    for (size_t c = 0; c < chunks.size(); ++c) {
        chunks_[c].layers = chunks[c];
        chunks_[c].embedding = c == 0 && shard_.embedding;
        chunks_[c].head = c + 1 == chunks.size() && shard_.head;
    }
    build_registry();
    build_units();
    resolve_handles();
    flat_size_ = registry_.total();
    const size_t n_units = units_.size();
    pbase_.assign(n_units, nullptr);
    gbase_.assign(n_units, nullptr);
    hbase_.assign(n_units, nullptr);
    if (storage_ != Storage::sharded) {
        params_ = core::Tensor({flat_size_}, DType::f32, MemCategory::params);
        for (size_t u = 0; u < n_units; ++u) pbase_[u] = params_.f32() + units_[u].begin;
    }
    if (storage_ == Storage::full) {
        grads_ = core::Tensor({flat_size_}, DType::f32, MemCategory::grads);
        for (size_t u = 0; u < n_units; ++u) gbase_[u] = grads_.f32() + units_[u].begin;
    }
    if (precision_ == Precision::bf16 && storage_ != Storage::sharded) {
        shadow_ = core::Tensor({flat_size_}, DType::bf16, MemCategory::params);
        for (size_t u = 0; u < n_units; ++u) {
            hbase_[u] = shadow_.data<uint16_t>() + units_[u].begin;
        }
    } else if (precision_ == Precision::fp16) {
        shadow_ = core::Tensor({flat_size_}, DType::f32, MemCategory::params);
    }
    allocate_activations();
}

Transformer::~Transformer() = default;

namespace {

// (global start, length) of tensor-parallel rank r's heads in a projection
// whose rows are [q heads | k heads | v heads] (GPT-2's c_attn).
Shard fused_qkv_rows(int64_t C, int64_t Cl, int rank) {
    return {0, {{rank * Cl, Cl}, {C + rank * Cl, Cl}, {2 * C + rank * Cl, Cl}}};
}

Shard rows_of(int64_t begin, int64_t count) { return {0, {{begin, count}}}; }
Shard cols_of(int64_t begin, int64_t count) { return {1, {{begin, count}}}; }

}  // namespace

void Transformer::add_block_params(int l) {
    const int64_t C = dims_.C, HS = dims_.HS, Cl = dims_.Cl(), F = spec_.ffn_dim(), Fl = dims_.F,
                  KV = spec_.kv_dim(), KVl = dims_.KVH * HS;
    const int r = shard_.tp_rank;
    const bool tp = shard_.tp_size > 1;
    auto& reg = registry_;
    // A norm weight or bias: whole on every rank; under sequence
    // parallelism each rank's gradient covers its rows only.
    auto norm = [&](const std::string& name, Init init) {
        ParamInfo& e = reg.add(name, {C}, false, l);
        e.init = init;
        e.tp_partial_grad = shard_.sequence_parallel;
    };
    // A split matrix (or bias): local shape, global shape, pieces.
    auto split = [&](const std::string& name, std::vector<int64_t> local,
                     std::vector<int64_t> global, Shard s, bool decay, Init init,
                     bool pad_after = true) {
        ParamInfo& e = tp ? reg.add(name, std::move(local), decay, l, pad_after, std::move(global),
                                    std::move(s))
                          : reg.add(name, std::move(local), decay, l, pad_after);
        e.init = init;
    };
    auto bias = [&](const std::string& name) { reg.add(name, {C}, false, l).init = Init::zeros; };
    if (spec_.arch == Arch::gpt2) {
        const std::string p = fmt::format("h.{}.", l);
        norm(p + "ln_1.weight", Init::ones);
        norm(p + "ln_1.bias", Init::zeros);
        split(p + "attn.c_attn.weight", {3 * Cl, C}, {3 * C, C}, fused_qkv_rows(C, Cl, r), true,
              Init::normal);
        split(p + "attn.c_attn.bias", {3 * Cl}, {3 * C}, fused_qkv_rows(C, Cl, r), false,
              Init::zeros);
        split(p + "attn.c_proj.weight", {C, Cl}, {C, C}, cols_of(r * Cl, Cl), true,
              Init::normal_residual);
        bias(p + "attn.c_proj.bias");
        norm(p + "ln_2.weight", Init::ones);
        norm(p + "ln_2.bias", Init::zeros);
        if (spec_.moe_layer(l)) {
            add_moe_params(l);
            return;
        }
        split(p + "mlp.c_fc.weight", {Fl, C}, {F, C}, rows_of(r * Fl, Fl), true, Init::normal);
        split(p + "mlp.c_fc.bias", {Fl}, {F}, rows_of(r * Fl, Fl), false, Init::zeros);
        split(p + "mlp.c_proj.weight", {C, Fl}, {C, F}, cols_of(r * Fl, Fl), true,
              Init::normal_residual);
        bias(p + "mlp.c_proj.bias");
    } else {
        const std::string p = fmt::format("model.layers.{}.", l);
        norm(p + "input_layernorm.weight", Init::ones);
        // q, k, v back to back: one (Cl + 2 KVl, C) matrix for a fused matmul.
        split(p + "self_attn.q_proj.weight", {Cl, C}, {C, C}, rows_of(r * Cl, Cl), true,
              Init::normal, false);
        split(p + "self_attn.k_proj.weight", {KVl, C}, {KV, C}, rows_of(r * KVl, KVl), true,
              Init::normal, false);
        split(p + "self_attn.v_proj.weight", {KVl, C}, {KV, C}, rows_of(r * KVl, KVl), true,
              Init::normal);
        split(p + "self_attn.o_proj.weight", {C, Cl}, {C, C}, cols_of(r * Cl, Cl), true,
              Init::normal_residual);
        norm(p + "post_attention_layernorm.weight", Init::ones);
        if (spec_.moe_layer(l)) {
            add_moe_params(l);
            return;
        }
        // gate and up back to back: one (2 Fl, C) matrix.
        split(p + "mlp.gate_proj.weight", {Fl, C}, {F, C}, rows_of(r * Fl, Fl), true, Init::normal,
              false);
        split(p + "mlp.up_proj.weight", {Fl, C}, {F, C}, rows_of(r * Fl, Fl), true, Init::normal);
        split(p + "mlp.down_proj.weight", {C, Fl}, {C, F}, cols_of(r * Fl, Fl), true,
              Init::normal_residual);
    }
}

void Transformer::build_registry() {
    const int64_t C = dims_.C, V = spec_.vocab_size, Vl = dims_.Vl;
    const bool gpt2 = spec_.arch == Arch::gpt2, tp = shard_.tp_size > 1;
    auto& r = registry_;
    const std::string wte = gpt2 ? "wte.weight" : "model.embed_tokens.weight";
    auto vocab_matrix = [&](const std::string& name) -> ParamInfo& {
        return tp ? r.add(name, {Vl, C}, true, -1, true, {V, C}, rows_of(dims_.v0, Vl))
                  : r.add(name, {V, C}, true, -1);
    };
    if (shard_.embedding) {
        vocab_matrix(wte);
        if (gpt2) {
            ParamInfo& e = r.add("wpe.weight", {spec_.max_seq_len, C}, true, -1);
            e.tp_partial_grad = shard_.sequence_parallel;
        }
    } else if (shard_.head && spec_.tie_embeddings) {
        // The last pipeline stage's copy of the tied embedding, in unit 0
        // like the first stage's: backward reports it complete last, so its
        // data-parallel reduction can wait for the sum with the first stage.
        vocab_matrix(wte).tied_copy = true;
    }
    r.align(flat_multiple_);
    for (int l : local_layers_) {
        add_block_params(l);
        r.align(flat_multiple_);
    }
    if (shard_.head) {
        ParamInfo& w = r.add(gpt2 ? "ln_f.weight" : "model.norm.weight", {C}, false, -1);
        w.init = Init::ones;
        w.tp_partial_grad = shard_.sequence_parallel;
        if (gpt2) {
            ParamInfo& b = r.add("ln_f.bias", {C}, false, -1);
            b.init = Init::zeros;
            b.tp_partial_grad = shard_.sequence_parallel;
        }
        if (!spec_.tie_embeddings) vocab_matrix("lm_head.weight");
    }
    r.align(flat_multiple_);
}

void Transformer::build_units() {
    // Units: the entries before the first block, each block (under expert
    // parallelism followed by a unit of its routed experts), the rest.
    const auto& entries = registry_.entries();
    const bool split_experts = shard_.ep_size > 1;
    expert_unit_.assign(size_t(spec_.n_layer), -1);
    int next = 1;
    for (int l : local_layers_) {
        layer_unit_[size_t(l)] = next++;
        if (split_experts && spec_.moe_layer(l)) expert_unit_[size_t(l)] = next++;
    }
    units_.assign(size_t(next) + 1, Unit{});
    for (int l : local_layers_) {
        if (expert_unit_[size_t(l)] >= 0) units_[size_t(expert_unit_[size_t(l)])].expert = true;
    }
    unit_of_entry_.clear();
    bool after_blocks = false;
    for (const auto& e : entries) {
        int u = e.layer >= 0 ? layer_unit_[size_t(e.layer)] : 0;
        if (e.layer >= 0 && e.expert && split_experts) u = expert_unit_[size_t(e.layer)];
        if (e.layer >= 0) after_blocks = true;
        if (e.layer < 0 && after_blocks) u = int(units_.size()) - 1;
        unit_of_entry_.push_back(u);
    }
    // Each unit runs from its first entry to the next unit's first entry;
    // a unit with no entries is empty at the next one's start.
    std::vector<int64_t> first(units_.size(), -1);
    for (size_t i = 0; i < entries.size(); ++i) {
        auto& f = first[size_t(unit_of_entry_[i])];
        if (f < 0) f = entries[i].offset;
    }
    if (first[0] < 0) first[0] = 0;
    int64_t end = registry_.total();
    for (int u = int(units_.size()) - 1; u >= 0; --u) {
        const int64_t begin = first[size_t(u)] < 0 ? end : first[size_t(u)];
        units_[size_t(u)].begin = begin;
        units_[size_t(u)].end = end;
        end = begin;
    }
}

void Transformer::resolve_handles() {
    const auto& r = registry_;
    const bool gpt2 = spec_.arch == Arch::gpt2;
    block_params_.assign(size_t(spec_.n_layer), BlockParams{});
    for (int l : local_layers_) {
        static_cast<BlockHandles&>(block_params_[size_t(l)]) = block_handles(r, gpt2, l);
        if (spec_.moe_layer(l)) resolve_moe_handles(l, block_prefix(gpt2, l));
    }
    const std::string wte = gpt2 ? "wte.weight" : "model.embed_tokens.weight";
    wte_ = shard_.embedding ? r.index_of(wte) : -1;
    wpe_ = r.index_of("wpe.weight");
    lnf_w_ = r.index_of(gpt2 ? "ln_f.weight" : "model.norm.weight");
    lnf_b_ = r.index_of("ln_f.bias");
    head_w_ = shard_.head ? r.index_of(spec_.tie_embeddings ? wte : "lm_head.weight") : -1;
}

const float* Transformer::P(int i) const {
    const ParamInfo& e = registry_.entries()[size_t(i)];
    const int u = unit_of_entry_[size_t(i)];
    const float* base = pbase_[size_t(u)];
    APIARY_CHECK(base != nullptr, "parameters of unit {} ('{}') are not resident", u, e.name);
    return base + (e.offset - units_[size_t(u)].begin);
}

float* Transformer::G(int i) {
    const ParamInfo& e = registry_.entries()[size_t(i)];
    const int u = unit_of_entry_[size_t(i)];
    float* base = gbase_[size_t(u)];
    APIARY_CHECK(base != nullptr, "gradients of unit {} ('{}') are not resident", u, e.name);
    return base + (e.offset - units_[size_t(u)].begin);
}

const uint16_t* Transformer::H(int i) const {
    const ParamInfo& e = registry_.entries()[size_t(i)];
    const int u = unit_of_entry_[size_t(i)];
    const uint16_t* base = hbase_[size_t(u)];
    APIARY_CHECK(base != nullptr, "bf16 weights of unit {} ('{}') are not resident", u, e.name);
    return base + (e.offset - units_[size_t(u)].begin);
}

void Transformer::use_params(int u, int next) {
    // Resident already: the embedding and final units stay lent across the
    // micro-batches of a step (several are in flight under a pipeline).
    if (storage_ != Storage::sharded || units_[size_t(u)].size() == 0 || pbase_[size_t(u)]) {
        return;
    }
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
    if (storage_ == Storage::full || units_[size_t(u)].size() == 0 || gbase_[size_t(u)]) return;
    APIARY_CHECK(store_ != nullptr, "sharded gradients without a unit store");
    gbase_[size_t(u)] = store_->acquire_grads(u);
}

void Transformer::done_grads(int u) {
    if (storage_ == Storage::full || gbase_[size_t(u)] == nullptr) return;
    store_->release_grads(u);
    gbase_[size_t(u)] = nullptr;
}

int64_t Transformer::rows(int64_t B, int64_t T) const {
    return shard_.sequence_parallel ? B * T / shard_.tp_size : B * T;
}

void Transformer::init(uint64_t seed) { init_into(seed, params()); }

void Transformer::init_into(uint64_t seed, float* p) const {
    std::memset(p, 0, size_t(flat_size()) * sizeof(float));
    const float std_resid = 0.02f / std::sqrt(2.0f * float(spec_.n_layer));
    for (const auto& e : registry_.entries()) {
        float* dst = p + e.offset;
        if (e.init == Init::zeros) continue;
        if (e.init == Init::ones) {
            std::fill_n(dst, e.numel(), 1.0f);
            continue;
        }
        const float std = e.init == Init::normal_residual ? std_resid : 0.02f;
        // The stream is a hash of the name and the element's global index:
        // initialisation that does not depend on the layout.
        const core::Philox rng(seed, XXH64(e.name.data(), e.name.size(), 0));
        e.placement().for_each_run([&](int64_t global, int64_t local, int64_t len) {
#pragma omp parallel for schedule(static)
            for (int64_t i = 0; i < len; ++i) {
                dst[local + i] = rng.normal(uint64_t(global + i)) * std;
            }
        });
    }
}

void Transformer::zero_grads() {
    APIARY_PROFILE("zero grads");
    if (grads_.numel() > 0) grads_.zero();
}

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

void Transformer::lin_fwd(float* y, float* x, int64_t x_half, int w, int b, int64_t N, int64_t IN,
                          int64_t OUT) {
    APIARY_PROFILE("matmul forward");
    const float* bias = b < 0 ? nullptr : P(b);
    switch (precision_) {
        case Precision::fp32:
            k::linear_forward(y, x, P(w), bias, N, IN, OUT);
            break;
        case Precision::bf16:
            if (x) k::to_bf16(half(x_half), x, N * IN);
            k::linear_forward_bf16(y, half(x_half), H(w), bias, N, IN, OUT);
            break;
        case Precision::fp16:
            k::round_to_f16(x, N * IN);  // the saved input is the fp16 value
            k::linear_forward(y, x, shadow_.f32() + registry_.entries()[size_t(w)].offset, bias, N,
                              IN, OUT);
            break;
    }
}

void Transformer::lin_fwd_to_half(int64_t y_half, float* x, int64_t x_half, int w, int b, int64_t N,
                                  int64_t IN, int64_t OUT) {
    APIARY_PROFILE("matmul forward");
    APIARY_CHECK(precision_ == Precision::bf16, "lin_fwd_to_half is for bf16 mode");
    if (x) k::to_bf16(half(x_half), x, N * IN);
    k::linear_forward_bf16_out(half(y_half), half(x_half), H(w), b < 0 ? nullptr : P(b), N, IN,
                               OUT);
}

void Transformer::lin_bwd(float* dx, int w, int b, const float* dy, const float* x, int64_t x_half,
                          int64_t N, int64_t IN, int64_t OUT) {
    APIARY_PROFILE("matmul backward");
    float* dbias = b < 0 ? nullptr : G(b);
    switch (precision_) {
        case Precision::fp32:
            k::linear_backward(dx, G(w), dbias, dy, x, P(w), N, IN, OUT);
            break;
        case Precision::bf16: {
            // One pass over dy: its bf16 copy and the bias gradient.
            uint16_t* dyh = grad_half_.data<uint16_t>();
            if (dy) k::to_bf16_column_sums(dyh, dbias, dy, N, OUT);
            k::linear_backward_bf16(dx, G(w), dyh, half(x_half), H(w), N, IN, OUT);
            break;
        }
        case Precision::fp16: {
            // The incoming gradient as an fp16 tensor would hold it: an
            // overflow here is what the loss scaler must catch.
            float* dyq = grad_half_.f32();
            k::copy_round_to_f16(dyq, dy, N * OUT);
            k::linear_backward(dx, G(w), dbias, dyq, x,
                               shadow_.f32() + registry_.entries()[size_t(w)].offset, N, IN, OUT);
            break;
        }
    }
}

}  // namespace apiary::model
