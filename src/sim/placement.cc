// Where the ranks of several jobs go on one fabric (sim/collective.h).

#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "core/rng.h"
#include "sim/collective.h"

namespace apiary::sim {

const char* placement_name(Placement p) {
    switch (p) {
        case Placement::packed:
            return "packed";
        case Placement::spread:
            return "spread";
        case Placement::random:
            return "random";
        case Placement::topology:
            return "topology";
    }
    return "?";
}

Placement parse_placement(const std::string& name) {
    for (Placement p :
         {Placement::packed, Placement::spread, Placement::random, Placement::topology}) {
        if (name == placement_name(p)) return p;
    }
    throw ConfigError(fmt::format(
        "--placements: unknown placement '{}' (known: packed, spread, random, topology)", name));
}

namespace {

using Devs = std::vector<long long>;

// Topology-aware: the smallest block (a node, then each tier's block of
// devices) with room for the whole job, the fullest such block first (best
// fit keeps large free blocks for large jobs); inside it, the nodes with
// the most free devices first. A job no block can hold takes what is free.
Devs best_fit(const Fabric& f, std::vector<char>& used, long long need) {
    std::vector<long long> sizes = {f.per_node()};
    for (size_t k = 0; k < f.tiers(); ++k) sizes.push_back(f.tier_size(k));
    const long long n = f.devices();
    for (long long bs : sizes) {
        long long best = -1, best_free = n + 1;
        for (long long b = 0; b * bs < n; ++b) {
            long long fr = 0;
            for (long long d = b * bs; d < std::min(n, (b + 1) * bs); ++d) fr += !used[size_t(d)];
            if (fr >= need && fr < best_free) best = b, best_free = fr;
        }
        if (best < 0) continue;
        std::vector<std::pair<long long, long long>> nodes;  // (-free, first device)
        const long long per = f.per_node();
        for (long long d0 = best * bs; d0 < std::min(n, (best + 1) * bs); d0 += per) {
            long long fr = 0;
            for (long long d = d0; d < std::min(n, d0 + per); ++d) fr += !used[size_t(d)];
            nodes.emplace_back(-fr, d0);
        }
        std::stable_sort(nodes.begin(), nodes.end());
        Devs out;
        for (const auto& [_, d0] : nodes) {
            for (long long d = d0; d < std::min(n, d0 + per) && (long long)out.size() < need; ++d) {
                if (!used[size_t(d)]) out.push_back(d);
            }
        }
        for (long long d : out) used[size_t(d)] = 1;
        std::sort(out.begin(), out.end());
        return out;
    }
    Devs out;
    for (long long d = 0; d < n && (long long)out.size() < need; ++d) {
        if (!used[size_t(d)]) out.push_back(d), used[size_t(d)] = 1;
    }
    return out;
}

}  // namespace

std::vector<std::vector<long long>> place(const Fabric& f, const std::vector<long long>& sizes,
                                          Placement p, uint64_t seed) {
    const long long n = f.devices();
    const long long total = std::accumulate(sizes.begin(), sizes.end(), 0LL);
    if (total > n) {
        throw ConfigError(fmt::format(
            "the jobs need {} devices but the fabric has {} (cluster.gpus): a smaller job, or "
            "a larger --gpus",
            total, n));
    }
    std::vector<std::vector<long long>> out;
    if (p == Placement::topology) {
        std::vector<char> used(size_t(n), 0);
        for (long long s : sizes) out.push_back(best_fit(f, used, s));
        return out;
    }
    Devs order(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    if (p == Placement::spread) {
        // Position s of every node before position s + 1 of any.
        const long long per = f.per_node(), nodes = (n + per - 1) / per;
        order.clear();
        for (long long s = 0; s < per; ++s) {
            for (long long node = 0; node < nodes; ++node) {
                if (node * per + s < n) order.push_back(node * per + s);
            }
        }
    } else if (p == Placement::random) {
        const core::Philox rng(seed, 17);  // Fisher-Yates with counter-based draws
        for (long long i = n - 1; i > 0; --i) {
            std::swap(order[size_t(i)], order[size_t(rng.below(uint64_t(i), uint64_t(i + 1)))]);
        }
    }
    size_t next = 0;
    for (long long s : sizes) {
        out.emplace_back(order.begin() + long(next), order.begin() + long(next + size_t(s)));
        next += size_t(s);
    }
    return out;
}

}  // namespace apiary::sim
