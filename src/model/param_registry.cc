#include "model/param_registry.h"

#include "core/error.h"

namespace apiary::model {

int64_t ParamInfo::numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
}

const ParamInfo& ParamRegistry::add(const std::string& name, std::vector<int64_t> shape,
                                    bool decay, int layer, bool pad_after) {
    APIARY_CHECK(find(name) == nullptr, "parameter '{}' registered twice", name);
    ParamInfo info{name, total_, std::move(shape), decay, layer};
    total_ += pad_after ? (info.numel() + 15) / 16 * 16 : info.numel();
    entries_.push_back(std::move(info));
    return entries_.back();
}

void ParamRegistry::align(int64_t multiple) {
    APIARY_CHECK(multiple >= 1, "alignment {} must be positive", multiple);
    total_ = (total_ + multiple - 1) / multiple * multiple;
}

const ParamInfo* ParamRegistry::find(const std::string& name) const {
    for (const auto& e : entries_) {
        if (e.name == name) return &e;
    }
    return nullptr;
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

}  // namespace apiary::model
