#include "sim/fabric.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"

namespace apiary::sim {

namespace {

Fabric::Shape shape_of(const std::string& name) {
    if (name.rfind("rail", 0) == 0) return Fabric::Shape::rail;
    if (name.rfind("dragonfly", 0) == 0) return Fabric::Shape::dragonfly;
    return Fabric::Shape::tree;
}

}  // namespace

Fabric::Fabric(const plan::Cluster& c)
    : n_(c.n), per_node_(int(c.ranks_per_node())), shape_(shape_of(c.topo.name)), topo_(c.topo) {
    if (n_ < 1) throw ConfigError("sim comm: the fabric needs cluster.gpus >= 1");
    if (topo_.tiers.empty()) {
        throw ConfigError(fmt::format("topology '{}' has no tiers", topo_.name));
    }
    // The planner's sustained bandwidths: link x efficiency, and CPU ranks
    // sharing one memory system split the intra-node copy bandwidth.
    intra_bw_ = c.intra.bw * c.intra.efficiency * (c.dev.shared_by_ranks ? c.share() : 1.0);
    intra_lat_ = c.intra.latency;
    nic_bw_ = c.inter.bw * c.inter.efficiency;
    nic_lat_ = c.inter.latency;
    // Per device: NVLink out, NVLink in, NIC out, NIC in.
    const char* kinds[] = {"intra out", "intra in", "nic out", "nic in"};
    for (int k = 0; k < 4; ++k) {
        for (long long d = 0; d < n_; ++d) {
            cap_.push_back(k < 2 ? intra_bw_ : nic_bw_);
            names_.push_back(fmt::format("device {} {}", d, kinds[k]));
        }
    }
    add_level_links();
}

long long Fabric::tier_size(size_t k) const {
    const long long s = topo_.tiers[k].devices;
    return s == 0 ? n_ : std::min(s, n_);
}

// Block of device d at a level: level 0 is the first tier's switches (a
// rail switch per node position in rail-optimized), level k > 0 tier k.
long long Fabric::block(size_t level, long long d) const {
    const long long s = tier_size(level);
    if (level == 0 && shape_ == Shape::rail) return (d / s) * per_node_ + d % per_node_;
    return d / s;
}

int Fabric::level_link(size_t level, long long blk, bool up) const {
    return int((up ? up_first_[level] : down_first_[level]) + blk);
}

void Fabric::add_level_links() {
    const size_t levels = topo_.tiers.size();
    for (size_t l = 0; l + 1 < levels; ++l) {
        const long long s = tier_size(l);
        long long nblocks = (n_ + s - 1) / s;
        if (l == 0 && shape_ == Shape::rail) nblocks *= per_node_;
        blocks_.push_back(nblocks);
        if (l == 0 && shape_ == Shape::dragonfly) {
            // Direct global links between groups instead of an upper tier.
            groups_ = nblocks;
            global_first_ = int(cap_.size());
            const double per_group = double(s) * nic_bw_ * topo_.tiers[1].bw_factor;
            for (long long g = 0; g < groups_; ++g) {
                for (long long h = 0; h < groups_; ++h) {
                    cap_.push_back(groups_ > 1 ? per_group / double(groups_ - 1) : per_group);
                    names_.push_back(fmt::format("global group {} -> {}", g, h));
                }
            }
            up_first_.push_back(-1);
            down_first_.push_back(-1);
            continue;
        }
        for (int dir = 0; dir < 2; ++dir) {
            (dir == 0 ? up_first_ : down_first_).push_back(int(cap_.size()));
            for (long long b = 0; b < nblocks; ++b) {
                // Devices below this switch (the last block may be short).
                long long below = s;
                if (l == 0 && shape_ == Shape::rail) {
                    const long long unit = b / per_node_;
                    below = (std::min(n_, (unit + 1) * s) - unit * s + per_node_ - 1) / per_node_;
                } else {
                    below = std::min(n_, (b + 1) * s) - b * s;
                }
                cap_.push_back(double(below) * nic_bw_ * topo_.tiers[l + 1].bw_factor);
                names_.push_back(fmt::format("{} {} {}", topo_.tiers[l].name, b,
                                             dir == 0 ? "uplink" : "downlink"));
            }
        }
    }
}

const std::string& Fabric::link_name(size_t link) const { return names_[link]; }

double Fabric::route(long long a, long long b, std::vector<int>& path) const {
    if (a == b) return 0;
    if (node_of(a) == node_of(b)) {
        path.push_back(int(a));       // intra out
        path.push_back(int(n_ + b));  // intra in
        return intra_lat_;
    }
    double extra = 0;
    long long src = a;
    if (shape_ == Shape::rail && a % per_node_ != b % per_node_) {
        // PXN: over NVLink to this node's device on b's rail, then its NIC.
        src = a - a % per_node_ + b % per_node_;
        path.push_back(int(a));
        path.push_back(int(n_ + src));
        extra = intra_lat_;
    }
    path.push_back(int(2 * n_ + src));  // NIC out
    const size_t levels = topo_.tiers.size();
    size_t top = 0;  // the level whose block holds both ends
    while (top + 1 < levels && block(top, src) != block(top, b)) ++top;
    if (shape_ == Shape::dragonfly && top > 0) {
        path.push_back(int(global_first_ + block(0, src) * groups_ + block(0, b)));
    } else {
        for (size_t l = 0; l < top; ++l) path.push_back(level_link(l, block(l, src), true));
        for (size_t l = top; l-- > 0;) path.push_back(level_link(l, block(l, b), false));
    }
    path.push_back(int(3 * n_ + b));  // NIC in
    return nic_lat_ + topo_.tiers[top].latency + extra;
}

}  // namespace apiary::sim
