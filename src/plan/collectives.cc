#include "plan/collectives.h"

#include <algorithm>
#include <cmath>

namespace apiary::plan {

double ring_all_reduce_s(long long n, double bytes, double bw, double alpha) {
    if (n <= 1) return 0;
    // Reduce-scatter then all-gather, each n-1 steps of bytes/n (Patarasuk &
    // Yuan 2009): 2(n-1)/n * S/bw + 2(n-1) alpha.
    const double k = double(n - 1);
    return 2 * k / double(n) * bytes / bw + 2 * k * alpha;
}

double ring_reduce_scatter_s(long long n, double bytes, double bw, double alpha) {
    if (n <= 1) return 0;
    const double k = double(n - 1);
    return k / double(n) * bytes / bw + k * alpha;
}

double tree_all_reduce_s(long long n, double bytes, double bw, double alpha) {
    if (n <= 1) return 0;
    // Pipelined double binary tree: the bandwidth term of a ring (each rank
    // sends and receives ~S twice) but 2 log2(n) latency steps.
    return 2 * bytes / bw + 2 * std::ceil(std::log2(double(n))) * alpha;
}

long long Cluster::ranks_per_node() const {
    return std::max<long long>(1, std::min<long long>(n, dev.devices_per_node));
}

long long Cluster::nodes() const { return (n + ranks_per_node() - 1) / ranks_per_node(); }

double Cluster::share() const { return dev.shared_by_ranks ? 1.0 / double(ranks_per_node()) : 1.0; }

Path group_path(const Cluster& c, Group g) {
    Path p;
    const long long dpn = c.ranks_per_node();
    p.per_node = g.stride >= dpn ? 1 : std::min(g.size, std::max<long long>(1, dpn / g.stride));
    p.nodes = (g.size + p.per_node - 1) / p.per_node;
    p.intra_bw = c.intra.bw * c.intra.efficiency;
    p.intra_alpha = c.intra.latency;
    if (c.dev.shared_by_ranks) p.intra_bw *= c.share();  // copies share one memory system
    p.tier = "node";
    if (p.nodes > 1) {
        const double extent = double(g.size) * double(g.stride);
        const Tier* tier = &c.topo.tiers.back();
        for (const auto& t : c.topo.tiers) {
            if (t.devices == 0 || double(t.devices) >= extent) {
                tier = &t;
                break;
            }
        }
        p.tier = tier->name;
        p.inter_bw = c.inter.bw * c.inter.efficiency * tier->bw_factor;
        p.inter_alpha = c.inter.latency + tier->latency;
    }
    return p;
}

namespace {

// tree_ok: all-gather and reduce-scatter have neither a tree nor a
// hierarchical algorithm in NCCL: one flat ring over all members (NCCL
// 2.x tuning tables: ncclFuncAllGather / ncclFuncReduceScatter support
// NCCL_ALGO_RING only, CollNet/NVLS aside), so their latency grows with n
// as (n - 1) alpha unless cluster.collective = hierarchical says the library
// does better. This is what makes DeepSpeed's 2021 ZeRO-3 collapse at
// 768-1,536 GPUs (Narayanan et al. 2021, Table 2).
double all_reduce_path(const Cluster& c, const Path& p, long long n, double bytes, bool tree_ok,
                       bool own_nic = false) {
    if (n <= 1) return 0;
    Algo algo = c.algo;
    if (!tree_ok && (algo == Algo::tree || algo == Algo::automatic)) algo = Algo::ring;
    if (p.nodes == 1) {
        const double ring = ring_all_reduce_s(n, bytes, p.intra_bw, p.intra_alpha);
        const double tree = tree_ok ? tree_all_reduce_s(n, bytes, p.intra_bw, p.intra_alpha) : ring;
        if (algo == Algo::tree) return tree;
        if (algo == Algo::automatic) return std::min(ring, tree);
        return ring;
    }
    // Across nodes the members of a node drive their NICs in parallel
    // (NCCL runs one ring per NIC), so the bus bandwidth is per_node NICs,
    // capped by the intra-node link that feeds them.
    const double k = own_nic ? 1.0 : double(p.per_node);
    double bus = p.inter_bw * k;
    if (p.per_node > 1) bus = std::min(bus, p.intra_bw);
    const double ring = ring_all_reduce_s(n, bytes, bus, p.inter_alpha);
    const double tree = tree_ok ? tree_all_reduce_s(n, bytes, bus, p.inter_alpha) : ring;
    // Hierarchical: reduce-scatter inside the node, all-reduce S/k across
    // nodes on each NIC, all-gather inside the node.
    const double hier = 2 * ring_reduce_scatter_s(p.per_node, bytes, p.intra_bw, p.intra_alpha) +
                        ring_all_reduce_s(p.nodes, bytes / k, p.inter_bw, p.inter_alpha);
    switch (algo) {
        case Algo::ring:
            return ring;
        case Algo::tree:
            return tree;
        case Algo::hierarchical:
            return hier;
        case Algo::automatic:
            return std::min({ring, tree, hier});
    }
    return ring;
}

}  // namespace

double all_reduce_s(const Cluster& c, Group g, double bytes, bool own_nic) {
    if (g.size <= 1 || bytes <= 0) return 0;
    return all_reduce_path(c, group_path(c, g), g.size, bytes, true, own_nic);
}

double reduce_scatter_s(const Cluster& c, Group g, double bytes) {
    // Half of an all-reduce done as reduce-scatter + all-gather (ring or
    // hierarchical; never a tree).
    if (g.size <= 1 || bytes <= 0) return 0;
    return 0.5 * all_reduce_path(c, group_path(c, g), g.size, bytes, false);
}

double p2p_s(const Cluster& c, long long stride, double bytes) {
    if (bytes <= 0) return 0;
    const Path p = group_path(c, Group{2, stride});
    if (p.nodes == 1) return p.intra_alpha + bytes / p.intra_bw;
    return p.inter_alpha + bytes / p.inter_bw;
}

double all_to_all_s(const Cluster& c, Group g, double bytes) {
    if (g.size <= 1 || bytes <= 0) return 0;
    const Path p = group_path(c, g);
    const double n = double(g.size), local = double(p.per_node);
    const double intra = bytes * (local - 1) / n / p.intra_bw + (local - 1) * p.intra_alpha;
    if (p.nodes == 1) return intra;
    const double inter = bytes * (n - local) / n / p.inter_bw + double(p.nodes - 1) * p.inter_alpha;
    return std::max(intra, inter);
}

}  // namespace apiary::plan
