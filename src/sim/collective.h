#pragma once
// Collectives as steps of transfers between devices, the algorithms the
// planner costs in closed form (docs/planner.md, plan/collectives.h):
//   ring: reduce-scatter then all-gather around a ring, one ring per NIC of
//     a node ("channels"), each ring entering and leaving a node on the same
//     rail, chunks of S / (channels x n);
//   tree: NCCL's double binary tree, half the buffer on each tree, reduce up
//     then broadcast down, pipelined (one step per phase with log2(n) alphas);
//     across nodes of k ranks, one channel per NIC: trees over the nodes'
//     ranks at that position, chains inside the nodes;
//   hierarchical: reduce-scatter inside each node, an all-reduce of S / k
//     across nodes on each of the k node positions, all-gather inside;
//   all-to-all: every rank sends S / n to every other, all at once, latency
//     once per peer on the node and once per peer node across nodes.
// And where the ranks of several jobs go: packed, spread, random or
// topology-aware placement.

#include <string>
#include <vector>

#include "plan/types.h"
#include "sim/fabric.h"
#include "sim/flow_sim.h"

namespace apiary::sim {

enum class Op { all_reduce, reduce_scatter, all_gather, all_to_all };
const char* op_name(Op op);
Op parse_op(const std::string& name);  // throws ConfigError listing the known ones

// The steps of `op` on `bytes` (the whole buffer, as the planner counts it)
// over the devices in rank order; resolve Algo::automatic with choose_algo
// first (here it means ring). `note` says when an algorithm had to give way
// (hierarchical needs the same number of ranks on every node).
std::vector<Step> collective_steps(const Fabric& f, const std::vector<long long>& devices, Op op,
                                   plan::Algo algo, double bytes, std::string* note = nullptr);

// The planner's alpha-beta time for the same collective on n ranks packed
// in order (Group{n, 1}), all-to-all included (plan::all_to_all_s). On an
// idle fabric the simulated steps take the same time (for all-to-all where
// one kind of link is the slower in both latency and bandwidth, as on every
// GPU node of the catalog).
double alpha_beta_s(const plan::Cluster& c, long long n, Op op, plan::Algo algo, double bytes);
// The algorithm the planner's formulas find fastest (ring for all-to-all).
plan::Algo choose_algo(const plan::Cluster& c, long long n, Op op, double bytes);

enum class Placement {
    packed,    // consecutive devices: whole nodes, neighbouring nodes
    spread,    // round-robin over nodes: as many nodes as possible
    random,    // devices in a random order (a fragmented cluster)
    topology,  // the smallest node, leaf or tier block that holds the job, best fit
};
const char* placement_name(Placement p);
Placement parse_placement(const std::string& name);

// Devices for each job in rank order. Throws ConfigError when the jobs
// need more devices than the fabric has.
std::vector<std::vector<long long>> place(const Fabric& f, const std::vector<long long>& sizes,
                                          Placement p, uint64_t seed = 1);

}  // namespace apiary::sim
