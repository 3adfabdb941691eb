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

namespace {

// Each handle's name in a GPT-2 and in a Llama block (nullptr: none).
struct BlockName {
    int BlockHandles::*handle;
    const char* gpt2;
    const char* llama;
};
constexpr BlockName kBlockNames[] = {
    {&BlockHandles::ln1_w, "ln_1.weight", "input_layernorm.weight"},
    {&BlockHandles::ln1_b, "ln_1.bias", nullptr},
    {&BlockHandles::qkv_w, "attn.c_attn.weight", "self_attn.q_proj.weight"},
    {&BlockHandles::qkv_b, "attn.c_attn.bias", nullptr},
    {&BlockHandles::proj_w, "attn.c_proj.weight", "self_attn.o_proj.weight"},
    {&BlockHandles::proj_b, "attn.c_proj.bias", nullptr},
    {&BlockHandles::ln2_w, "ln_2.weight", "post_attention_layernorm.weight"},
    {&BlockHandles::ln2_b, "ln_2.bias", nullptr},
    {&BlockHandles::fc_w, "mlp.c_fc.weight", "mlp.gate_proj.weight"},
    {&BlockHandles::fc_b, "mlp.c_fc.bias", nullptr},
    {&BlockHandles::fc2_w, "mlp.c_proj.weight", "mlp.down_proj.weight"},
    {&BlockHandles::fc2_b, "mlp.c_proj.bias", nullptr},
};

}  // namespace

BlockHandles block_handles(const ParamRegistry& r, bool gpt2, int l) {
    const std::string p = block_prefix(gpt2, l);
    BlockHandles b;
    for (const BlockName& n : kBlockNames) {
        if (const char* name = gpt2 ? n.gpt2 : n.llama) b.*n.handle = r.index_of(p + name);
    }
    return b;
}

}  // namespace apiary::model
