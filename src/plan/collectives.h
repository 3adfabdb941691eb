#pragma once
// Alpha-beta cost of collectives (Hockney 1994; Thakur, Rabenseifner & Gropp
// 2005; NCCL's double binary trees, Sanders et al. 2009) on the tier of the
// cluster a process group crosses.

#include "plan/types.h"

namespace apiary::plan {

// Closed forms. bytes: the full buffer; bw: bytes/s per rank per direction;
// alpha: seconds per step.
double ring_all_reduce_s(long long n, double bytes, double bw, double alpha);
double ring_reduce_scatter_s(long long n, double bytes, double bw, double alpha);
double tree_all_reduce_s(long long n, double bytes, double bw, double alpha);

// A process group: `size` ranks, consecutive members `stride` ranks apart in
// the global rank order (core/parallelism.h: tp, cp, dp, pp; tp groups have
// stride 1, dp stride tp * cp, pp stride tp * cp * dp). Ranks fill nodes in
// order.
struct Group {
    long long size = 1;
    long long stride = 1;
};

struct Path {                // how a group maps onto the cluster
    long long per_node = 1;  // members sharing a node
    long long nodes = 1;     // nodes the group spans
    double intra_bw = 0, intra_alpha = 0;
    double inter_bw = 0, inter_alpha = 0;  // per member NIC, after the tier's taper
    std::string tier;                      // "node" when it stays inside one
};
Path group_path(const Cluster& c, Group g);

// own_nic: across nodes each rank's traffic leaves through its own NIC
// (tensor parallelism's per-layer all-reduces, on the critical path); by
// default the members of a node drive their NICs in parallel, as NCCL's
// per-rail rings do for bucketed gradients.
double all_reduce_s(const Cluster& c, Group g, double bytes, bool own_nic = false);
double reduce_scatter_s(const Cluster& c, Group g, double bytes);  // = all-gather
double p2p_s(const Cluster& c, long long stride, double bytes);
// All-to-all in which every rank sends `bytes` in total, 1/size of it to
// each member (itself included): the node-local share over the intra-node
// link and the rest over the rank's NIC, concurrently. Pairwise: a latency
// per peer on the node, and per peer node across nodes (the messages to one
// node's ranks leave through the rank's NIC together). sim/ uses it too.
double all_to_all_s(const Cluster& c, Group g, double bytes);

}  // namespace apiary::plan
