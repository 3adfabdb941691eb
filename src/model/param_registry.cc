#include "model/param_registry.h"

#include <fmt/format.h>

#include "core/error.h"

namespace apiary::model {

namespace {
int64_t product(const std::vector<int64_t>& s) {
    int64_t n = 1;
    for (int64_t d : s) n *= d;
    return n;
}
}  // namespace

int64_t ParamInfo::numel() const { return product(shape); }

int64_t ParamInfo::global_numel() const { return product(global_shape); }

core::Placement ParamInfo::placement() const {
    return {global_shape, shape, shard.dim, shard.pieces};
}

ParamInfo& ParamRegistry::add(const std::string& name, std::vector<int64_t> shape, bool decay,
                              int layer, bool pad_after, std::vector<int64_t> global_shape,
                              Shard shard) {
    APIARY_CHECK(find(name) == nullptr, "parameter '{}' registered twice", name);
    ParamInfo info;
    info.name = name;
    info.offset = total_;
    info.shape = std::move(shape);
    info.decay = decay;
    info.layer = layer;
    info.global_shape = global_shape.empty() ? info.shape : std::move(global_shape);
    info.shard = std::move(shard);
    if (info.split()) {
        int64_t along = 0;
        for (const auto& p : info.shard.pieces) along += p.second;
        APIARY_CHECK(along == info.shape[size_t(info.shard.dim)],
                     "'{}': pieces of {} along dim {} but a local size of {}", name, along,
                     info.shard.dim, info.shape[size_t(info.shard.dim)]);
    }
    total_ += pad_after ? (info.numel() + 15) / 16 * 16 : info.numel();
    index_[name] = int(entries_.size());
    entries_.push_back(std::move(info));
    return entries_.back();
}

void ParamRegistry::align(int64_t multiple) {
    APIARY_CHECK(multiple >= 1, "alignment {} must be positive", multiple);
    total_ = (total_ + multiple - 1) / multiple * multiple;
}

int ParamRegistry::index_of(const std::string& name) const {
    const auto it = index_.find(name);
    return it == index_.end() ? -1 : it->second;
}

const ParamInfo* ParamRegistry::find(const std::string& name) const {
    const int i = index_of(name);
    return i < 0 ? nullptr : &entries_[size_t(i)];
}

const ParamInfo& ParamRegistry::get(const std::string& name) const {
    const ParamInfo* p = find(name);
    APIARY_CHECK(p != nullptr, "no parameter named '{}'", name);
    return *p;
}

int64_t ParamRegistry::num_params() const {
    int64_t n = 0;
    for (const auto& e : entries_) n += e.numel();
    return n;
}

std::string block_prefix(bool gpt2, int l) {
    return gpt2 ? fmt::format("h.{}.", l) : fmt::format("model.layers.{}.", l);
}

BlockHandles block_handles(const ParamRegistry& r, bool gpt2, int l) {
    const std::string p = block_prefix(gpt2, l);
    BlockHandles b;
    if (gpt2) {
        b.ln1_w = r.index_of(p + "ln_1.weight");
        b.ln1_b = r.index_of(p + "ln_1.bias");
        b.qkv_w = r.index_of(p + "attn.c_attn.weight");
        b.qkv_b = r.index_of(p + "attn.c_attn.bias");
        b.proj_w = r.index_of(p + "attn.c_proj.weight");
        b.proj_b = r.index_of(p + "attn.c_proj.bias");
        b.ln2_w = r.index_of(p + "ln_2.weight");
        b.ln2_b = r.index_of(p + "ln_2.bias");
        b.fc_w = r.index_of(p + "mlp.c_fc.weight");
        b.fc_b = r.index_of(p + "mlp.c_fc.bias");
        b.fc2_w = r.index_of(p + "mlp.c_proj.weight");
        b.fc2_b = r.index_of(p + "mlp.c_proj.bias");
    } else {
        b.ln1_w = r.index_of(p + "input_layernorm.weight");
        b.qkv_w = r.index_of(p + "self_attn.q_proj.weight");
        b.proj_w = r.index_of(p + "self_attn.o_proj.weight");
        b.ln2_w = r.index_of(p + "post_attention_layernorm.weight");
        b.fc_w = r.index_of(p + "mlp.gate_proj.weight");
        b.fc2_w = r.index_of(p + "mlp.down_proj.weight");
    }
    return b;
}

}  // namespace apiary::model
