#pragma once
// The network of a cluster as links with bandwidth and latency, built from
// the planner's catalog (plan::Cluster: devices per node, intra-node link,
// per-device NIC, topology tiers with their taper). Every link is one
// direction of a cable or of a bundle of them; a flow's path is the links
// it crosses. docs/sim.md draws the three shapes:
//   tree (fat-tree, fat-tree-2to1, dcn): each tier's blocks of devices
//     share an uplink of (devices below) x NIC x the next tier's taper;
//   rail-optimized: device i of every node of a tier-0 unit meets on rail
//     switch i; traffic to another rail first crosses NVLink to the device on
//     the destination's rail (NCCL's PXN), then stays on that rail;
//   dragonfly+: groups of tier-0 size, non-blocking inside; every pair of
//     groups has direct global links, the group's share of the tapered
//     global bandwidth split evenly over the other groups (minimal routing).

#include <string>
#include <vector>

#include "plan/types.h"

namespace apiary::sim {

class Fabric {
  public:
    enum class Shape { tree, rail, dragonfly };

    explicit Fabric(const plan::Cluster& c);

    long long devices() const { return n_; }
    int per_node() const { return per_node_; }
    int node_of(long long d) const { return int(d / per_node_); }
    Shape shape() const { return shape_; }
    const std::string& topology() const { return topo_.name; }
    // Devices in one block of tier k (0: unbounded), for placement.
    long long tier_size(size_t k) const;
    size_t tiers() const { return topo_.tiers.size(); }

    size_t links() const { return cap_.size(); }
    double capacity(size_t link) const { return cap_[link]; }
    const std::string& link_name(size_t link) const;
    // A device's own link (intra-node or NIC), not a switch's.
    bool device_link(size_t link) const { return link < size_t(4 * n_); }
    // Appends the links from device a to device b to `path`; returns the
    // latency of one message on it (the planner's alpha for that tier).
    double route(long long a, long long b, std::vector<int>& path) const;

    double intra_bw() const { return intra_bw_; }
    double nic_bw() const { return nic_bw_; }

  private:
    long long block(size_t level, long long d) const;
    int level_link(size_t level, long long blk, bool up) const;
    void add_level_links();
    long long n_;
    int per_node_;
    Shape shape_;
    plan::Topology topo_;
    double intra_bw_, intra_lat_, nic_bw_, nic_lat_;
    std::vector<double> cap_;
    std::vector<std::string> names_;
    // Links of each tier above the NICs: first index of its up links, then
    // its down links, one per block.
    std::vector<int> up_first_, down_first_;
    std::vector<long long> blocks_;
    int global_first_ = -1;  // dragonfly: groups x groups directed links
    long long groups_ = 1;
};

}  // namespace apiary::sim
