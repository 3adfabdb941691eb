#include "comm/process_group.h"

#include <fmt/format.h>

#include <cstring>

#include "core/error.h"

namespace apiary::comm {

void wait_all(const std::vector<WorkHandle>& works) {
    for (const auto& w : works) {
        if (w) w->wait();
    }
}

std::string format_ranks(const std::vector<int>& ranks) {
    std::string out;
    for (size_t i = 0; i < ranks.size();) {
        size_t j = i;
        while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
        if (!out.empty()) out += ",";
        out += j == i ? fmt::format("{}", ranks[i])
                      : fmt::format("{}{}{}", ranks[i], j == i + 1 ? "," : "-", ranks[j]);
        i = j + 1;
    }
    return out;
}

std::string ProcessGroup::describe() const {
    return fmt::format("{} (world ranks {})", name_, format_ranks(world_ranks_));
}

void check_config_hash(ProcessGroup& world, uint64_t hash) {
    // Hashes travel as raw bytes (two f32 slots each); all_gather does no arithmetic.
    static_assert(sizeof(uint64_t) == 2 * sizeof(float));
    std::vector<uint64_t> all(size_t(world.size()));
    world.all_gather(&hash, all.data(), 2, DType::f32, Tag{"config_hash", 0})->wait();
    std::vector<int> differ;
    size_t first = 0;
    for (int r = 0; r < world.size(); ++r) {
        if (all[size_t(r)] == all[0]) continue;
        if (differ.empty()) first = size_t(r);
        differ.push_back(world.world_ranks()[size_t(r)]);
    }
    if (differ.empty()) return;
    throw CommError(fmt::format(
        "config differs between ranks: {} {} {} config hash {:016x} but rank {} has {:016x} "
        "(seen on rank {}); start every rank with the same config file and --set flags",
        differ.size() == 1 ? "rank" : "ranks", format_ranks(differ),
        differ.size() == 1 ? "has" : "have (the first)", all[first], world.world_ranks()[0], all[0],
        world.world_ranks()[size_t(world.rank())]));
}

void ProcessGroup::check_reducible(DType dt) const {
    if (dt == DType::f16) {
        throw CommError(fmt::format("{}: reductions support f32 and bf16, not f16", name()));
    }
}

void ProcessGroup::check_peer(int r) const {
    if (r < 0 || r >= size()) {
        throw CommError(fmt::format("{}: peer rank {} is outside 0..{}", name(), r, size() - 1));
    }
}

}  // namespace apiary::comm
