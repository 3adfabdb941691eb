#include "sim/collective.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "core/error.h"
#include "plan/collectives.h"

namespace apiary::sim {

const char* op_name(Op op) {
    switch (op) {
        case Op::all_reduce:
            return "all-reduce";
        case Op::reduce_scatter:
            return "reduce-scatter";
        case Op::all_gather:
            return "all-gather";
        case Op::all_to_all:
            return "all-to-all";
    }
    return "?";
}

Op parse_op(const std::string& name) {
    for (Op op : {Op::all_reduce, Op::reduce_scatter, Op::all_gather, Op::all_to_all}) {
        if (name == op_name(op)) return op;
    }
    throw ConfigError(fmt::format(
        "unknown collective '{}' (known: all-reduce, reduce-scatter, all-gather, all-to-all)",
        name));
}

namespace {

using Devs = std::vector<long long>;

// The devices of each node, in order of first appearance.
std::vector<Devs> by_node(const Fabric& f, const Devs& devices) {
    std::vector<Devs> groups;
    std::map<int, size_t> index;
    for (long long d : devices) {
        auto [it, fresh] = index.emplace(f.node_of(d), groups.size());
        if (fresh) groups.emplace_back();
        groups[it->second].push_back(d);
    }
    return groups;
}

bool even(const std::vector<Devs>& g) {
    for (const auto& x : g) {
        if (x.size() != g[0].size()) return false;
    }
    return true;
}

// One ring per node position when every node holds k ranks: ring c enters
// node j at position (c - j) mod k and leaves from the next position down,
// where the next node enters, so consecutive nodes meet on one rail and
// every device sends and receives exactly once over its NIC per step.
std::vector<Devs> rings(const std::vector<Devs>& g) {
    const size_t k = g[0].size();
    if (g.size() == 1 || k == 1 || !even(g)) {
        Devs r;
        for (const auto& x : g) r.insert(r.end(), x.begin(), x.end());
        return {r};
    }
    std::vector<Devs> out(k);
    for (size_t c = 0; c < k; ++c) {
        for (size_t j = 0; j < g.size(); ++j) {
            const size_t start = (c + k * g.size() - j) % k;
            for (size_t i = 0; i < k; ++i) out[c].push_back(g[j][(start + i) % k]);
        }
    }
    return out;
}

double latency_of(const Fabric& f, const std::vector<Transfer>& t) {
    std::vector<int> scratch;
    double lat = 0;
    for (const auto& x : t) {
        scratch.clear();
        lat = std::max(lat, f.route(x.src, x.dst, scratch));
    }
    return lat;
}

// `count` steps in which every ring passes `chunk` bytes to its neighbour.
void ring_steps(const Fabric& f, const std::vector<Devs>& rs, double chunk, size_t count,
                std::vector<Step>& out) {
    Step s;
    for (const auto& r : rs) {
        for (size_t i = 0; i < r.size() && r.size() > 1; ++i) {
            s.transfers.push_back(Transfer{r[i], r[(i + 1) % r.size()], chunk});
        }
    }
    s.latency = latency_of(f, s.transfers);
    s.times = (long long)count;
    if (count > 0) out.push_back(std::move(s));
}

void ring(const Fabric& f, const Devs& devices, Op op, double bytes, std::vector<Step>& out) {
    const auto rs = rings(by_node(f, devices));
    const double n = double(devices.size());
    const double chunk = bytes / (double(rs.size()) * n);
    const size_t steps = devices.size() - 1;
    ring_steps(f, rs, chunk, op == Op::all_reduce ? 2 * steps : steps, out);
}

// NCCL's double binary tree: tree A puts rank r under the rank that clears
// r's lowest set bit and sets the next (odd ranks are leaves); tree B is A
// mirrored (n even) or shifted by one (n odd), so most ranks are inner
// nodes in one tree and leaves in the other.
long long btree_parent(long long r, long long n) {
    if (r == 0) return -1;
    const long long bit = r & -r;
    long long up = (r ^ bit) | (bit << 1);
    if (up >= n) up = r ^ bit;
    return up;
}

// Edges child -> parent of both trees over `members`, `bytes` on each.
void btree_edges(const Devs& members, double bytes, Step& up, Step& down) {
    const long long n = (long long)members.size();
    for (int t = 0; t < 2; ++t) {
        auto pos = [&](long long r) { return t == 0 ? r : n % 2 == 0 ? n - 1 - r : (r + 1) % n; };
        auto rank = [&](long long p) {
            return t == 0 ? p : n % 2 == 0 ? n - 1 - p : (p + n - 1) % n;
        };
        for (long long r = 0; r < n; ++r) {
            const long long pp = btree_parent(pos(r), n);
            if (pp < 0) continue;
            const long long a = members[size_t(r)], b = members[size_t(rank(pp))];
            up.transfers.push_back(Transfer{a, b, bytes});
            down.transfers.push_back(Transfer{b, a, bytes});
        }
    }
}

// Half the buffer on each tree, reduced up and broadcast down. With k ranks
// on each of several nodes, as NCCL: one channel per node position c, whose
// node-level trees join the ranks at position c (one NIC each) and whose
// chain inside each node runs from position c round the node, S / k each.
void tree(const Fabric& f, const std::vector<Devs>& g, const Devs& devices, double bytes,
          std::vector<Step>& out) {
    Step up, down;
    const size_t k = g[0].size();
    if (g.size() == 1 || k == 1 || !even(g)) {
        btree_edges(devices, bytes / 2, up, down);
    } else {
        for (size_t c = 0; c < k; ++c) {
            Devs reps;
            for (const auto& node : g) {
                reps.push_back(node[c]);
                for (size_t i = 0; i + 1 < k; ++i) {  // chain towards position c
                    const long long a = node[(c + i + 1) % k], b = node[(c + i) % k];
                    up.transfers.push_back(Transfer{a, b, bytes / double(k)});
                    down.transfers.push_back(Transfer{b, a, bytes / double(k)});
                }
            }
            btree_edges(reps, bytes / double(2 * k), up, down);
        }
    }
    // Pipelined: each phase pays the depth in latency once.
    const double depth = std::ceil(std::log2(double(devices.size())));
    up.latency = depth * latency_of(f, up.transfers);
    down.latency = up.latency;
    out.push_back(std::move(up));
    out.push_back(std::move(down));
}

// Inside every node at once: a ring of `count` steps over its k ranks.
void intra_steps(const Fabric& f, const std::vector<Devs>& g, double chunk, size_t count,
                 std::vector<Step>& out) {
    ring_steps(f, g, chunk, count, out);
}

// Across nodes: one ring per node position i, over the i-th rank of every node.
std::vector<Devs> cross_rings(const std::vector<Devs>& g) {
    std::vector<Devs> rs(g[0].size());
    for (size_t i = 0; i < rs.size(); ++i) {
        for (const auto& x : g) rs[i].push_back(x[i]);
    }
    return rs;
}

void hierarchical(const Fabric& f, const std::vector<Devs>& g, Op op, double bytes,
                  std::vector<Step>& out) {
    const size_t k = g[0].size(), nodes = g.size();
    const double part = bytes / double(k);  // what each node position carries across
    const auto across = cross_rings(g);
    const double chunk = part / double(nodes);
    if (op != Op::all_gather) intra_steps(f, g, part, k - 1, out);  // reduce-scatter in node
    if (op == Op::all_reduce) {
        ring_steps(f, across, chunk, 2 * (nodes - 1), out);
    } else {
        ring_steps(f, across, chunk, nodes - 1, out);
    }
    if (op != Op::reduce_scatter) intra_steps(f, g, part, k - 1, out);  // all-gather in node
}

// Every rank sends S / n to every other at once. Latency as the planner
// counts it (plan::all_to_all_s): once per peer on the node over the node's
// links, once per peer node across nodes, the two concurrently.
void all_to_all(const Fabric& f, const Devs& devices, double bytes, std::vector<Step>& out) {
    Step s;
    const double each = bytes / double(devices.size());
    std::vector<int> scratch;
    double intra = 0, inter = 0;  // the slowest route of each kind
    for (long long a : devices) {
        for (long long b : devices) {
            if (a == b) continue;
            s.transfers.push_back(Transfer{a, b, each});
            scratch.clear();
            double& worst = f.node_of(a) == f.node_of(b) ? intra : inter;
            worst = std::max(worst, f.route(a, b, scratch));
        }
    }
    const auto g = by_node(f, devices);
    size_t local = 0;
    for (const auto& node : g) local = std::max(local, node.size());
    s.latency = std::max(double(local - 1) * intra, double(g.size() - 1) * inter);
    out.push_back(std::move(s));
}

}  // namespace

std::vector<Step> collective_steps(const Fabric& f, const std::vector<long long>& devices, Op op,
                                   plan::Algo algo, double bytes, std::string* note) {
    std::vector<Step> out;
    if (devices.size() <= 1 || bytes <= 0) return out;
    if (op == Op::all_to_all) {
        all_to_all(f, devices, bytes, out);
        return out;
    }
    const auto g = by_node(f, devices);
    if (algo == plan::Algo::tree && op != Op::all_reduce) algo = plan::Algo::ring;  // as NCCL
    if (algo == plan::Algo::hierarchical && (g.size() == 1 || g[0].size() == 1)) {
        algo = plan::Algo::ring;  // one level only: the same as a ring
    }
    if (algo == plan::Algo::hierarchical && !even(g)) {
        if (note) *note = "hierarchical needs the same number of ranks on every node: ring";
        algo = plan::Algo::ring;
    }
    switch (algo) {
        case plan::Algo::tree:
            tree(f, g, devices, bytes, out);
            break;
        case plan::Algo::hierarchical:
            hierarchical(f, g, op, bytes, out);
            break;
        default:
            ring(f, devices, op, bytes, out);
    }
    return out;
}

double alpha_beta_s(const plan::Cluster& c, long long n, Op op, plan::Algo algo, double bytes) {
    plan::Cluster cc = c;
    cc.algo = algo;
    const plan::Group g{n, 1};
    if (op == Op::all_reduce) return plan::all_reduce_s(cc, g, bytes);
    if (op == Op::all_to_all) return plan::all_to_all_s(cc, g, bytes);
    return plan::reduce_scatter_s(cc, g, bytes);
}

plan::Algo choose_algo(const plan::Cluster& c, long long n, Op op, double bytes) {
    if (op == Op::all_to_all) return plan::Algo::ring;
    plan::Algo best = plan::Algo::ring;
    double best_s = alpha_beta_s(c, n, op, best, bytes);
    for (plan::Algo a : {plan::Algo::tree, plan::Algo::hierarchical}) {
        if (a == plan::Algo::tree && op != Op::all_reduce) continue;
        const double s = alpha_beta_s(c, n, op, a, bytes);
        if (s < best_s) best = a, best_s = s;
    }
    return best;
}

}  // namespace apiary::sim
