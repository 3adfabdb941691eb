// The collective simulation against the planner's alpha-beta formulas on an
// idle fabric (ring, tree and hierarchical all-reduce, reduce-scatter,
// all-gather, all-to-all), and what contention
// does: two jobs sharing one link each get half of it.

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>

#include "plan/catalog.h"
#include "plan/collectives.h"
#include "sim/collective.h"
#include "sim_test_util.h"

namespace apiary::sim {
namespace {

constexpr double kGiB = 1024.0 * 1024 * 1024;

plan::Cluster cluster_of(const std::string& device, long long n, const std::string& topo) {
    return plan::cluster_from(
        test::config({"cluster.device=" + device, "cluster.gpus=" + std::to_string(n),
                      "cluster.topology=" + topo}),
        n);
}

std::vector<long long> range(long long first, long long n, long long stride = 1) {
    std::vector<long long> v;
    for (long long i = 0; i < n; ++i) v.push_back(first + i * stride);
    return v;
}

double simulate_one(const Fabric& f, const std::vector<long long>& devs, Op op, plan::Algo a,
                    double bytes) {
    return simulate_flows(f, {collective_steps(f, devs, op, a, bytes)}).finish_s[0];
}

// Inside one node (8 x H100 on NVLink): every algorithm and operation.
TEST(SimComm, OneNodeEqualsTheAlphaBetaFormulas) {
    const plan::Cluster c = cluster_of("H100-SXM", 8, "fat-tree");
    const Fabric f(c);
    const auto devs = range(0, 8);
    for (double bytes : {1e3, 1e6, 1 * kGiB}) {
        for (plan::Algo a : {plan::Algo::ring, plan::Algo::tree}) {
            plan::Cluster ca = c;
            ca.algo = a;
            EXPECT_NEAR(simulate_one(f, devs, Op::all_reduce, a, bytes) /
                            plan::all_reduce_s(ca, plan::Group{8, 1}, bytes),
                        1.0, 1e-9)
                << plan::algo_name(a) << " " << bytes;
        }
        const double rs = plan::reduce_scatter_s(c, plan::Group{8, 1}, bytes);
        EXPECT_NEAR(simulate_one(f, devs, Op::reduce_scatter, plan::Algo::ring, bytes) / rs, 1.0,
                    1e-9);
        EXPECT_NEAR(simulate_one(f, devs, Op::all_gather, plan::Algo::ring, bytes) / rs, 1.0, 1e-9);
        EXPECT_NEAR(simulate_one(f, devs, Op::all_to_all, plan::Algo::ring, bytes) /
                        alpha_beta_s(c, 8, Op::all_to_all, plan::Algo::ring, bytes),
                    1.0, 1e-9);
    }
}

// One rank per node (a group with stride 8), on the NICs: ring and tree,
// on a non-blocking fat-tree and on rail-optimized (all on rail 0).
TEST(SimComm, OneRankPerNodeEqualsTheAlphaBetaFormulas) {
    for (const char* topo : {"fat-tree", "rail-optimized"}) {
        const plan::Cluster c = cluster_of("H100-SXM", 512, topo);
        const Fabric f(c);
        const auto devs = range(0, 32, 8);
        for (plan::Algo a : {plan::Algo::ring, plan::Algo::tree}) {
            plan::Cluster ca = c;
            ca.algo = a;
            const double want = plan::all_reduce_s(ca, plan::Group{32, 8}, 256e6);
            EXPECT_NEAR(simulate_one(f, devs, Op::all_reduce, a, 256e6) / want, 1.0, 1e-9)
                << topo << " " << plan::algo_name(a);
        }
    }
}

// Whole nodes (8 nodes x 8): the ring uses one channel per NIC, each
// entering and leaving a node on one rail; the tree one channel per NIC
// with node-level trees and chains inside the nodes; the hierarchical
// algorithm reduces inside the nodes first. All equal the planner's forms
// (where the NICs, not NVLink, are the bottleneck, as on every GPU node of
// the catalog).
TEST(SimComm, WholeNodesEqualTheAlphaBetaFormulas) {
    const plan::Cluster c = cluster_of("H100-SXM", 1024, "fat-tree");
    const Fabric f(c);
    const auto devs = range(0, 64);
    for (plan::Algo a : {plan::Algo::ring, plan::Algo::hierarchical}) {
        plan::Cluster ca = c;
        ca.algo = a;
        for (Op op : {Op::all_reduce, Op::reduce_scatter, Op::all_gather}) {
            const double want = op == Op::all_reduce
                                    ? plan::all_reduce_s(ca, plan::Group{64, 1}, 1 * kGiB)
                                    : plan::reduce_scatter_s(ca, plan::Group{64, 1}, 1 * kGiB);
            EXPECT_NEAR(simulate_one(f, devs, op, a, 1 * kGiB) / want, 1.0, 1e-9)
                << plan::algo_name(a) << " " << op_name(op);
        }
    }
    plan::Cluster ct = c;
    ct.algo = plan::Algo::tree;
    EXPECT_NEAR(simulate_one(f, devs, Op::all_reduce, plan::Algo::tree, 1 * kGiB) /
                    plan::all_reduce_s(ct, plan::Group{64, 1}, 1 * kGiB),
                1.0, 1e-9);
    EXPECT_NEAR(simulate_one(f, devs, Op::all_to_all, plan::Algo::ring, 1 * kGiB) /
                    alpha_beta_s(c, 64, Op::all_to_all, plan::Algo::ring, 1 * kGiB),
                1.0, 1e-9);
}

// Four single-device nodes, two leaves of two; the leaves' uplinks carry
// one NIC's worth (2 devices x 0.5 taper). Jobs {0, 2} and {1, 3} both
// cross it: each gets half, so the transfer part of its time doubles.
TEST(SimComm, TwoJobsSharingOneLinkEachGetHalf) {
    plan::Cluster c = cluster_of("H100-SXM", 4, "fat-tree");
    c.dev.devices_per_node = 1;
    c.topo = plan::Topology{"tiny-tree", {{"leaf", 2, 1.0, 1e-6}, {"top", 0, 0.5, 2e-6}}, "test"};
    const Fabric f(c);
    const double bytes = 100e6;
    const auto a = collective_steps(f, {0, 2}, Op::all_reduce, plan::Algo::ring, bytes);
    const auto b = collective_steps(f, {1, 3}, Op::all_reduce, plan::Algo::ring, bytes);
    const double alpha = c.inter.latency + 2e-6;
    const double nic = c.inter.bw * c.inter.efficiency;
    // Ring of two: two steps of S/2 each.
    const double alone = simulate_flows(f, {a}).finish_s[0];
    EXPECT_NEAR(alone, 2 * (alpha + bytes / 2 / nic), 1e-12);
    const FlowStats both = simulate_flows(f, {a, b});
    for (double t : both.finish_s) EXPECT_NEAR(t, 2 * (alpha + bytes / 2 / (nic / 2)), 1e-12);
    EXPECT_NE(both.hottest_link.find("leaf"), std::string::npos) << both.hottest_link;
    // Without the taper the uplink holds both at full speed.
    c.topo.tiers[1].bw_factor = 1.0;
    const Fabric wide(c);
    for (double t : simulate_flows(wide, {a, b}).finish_s) EXPECT_NEAR(t, alone, 1e-12);
}

// On a 2:1 tapered fat-tree an idle ring across two leaves keeps the NICs'
// full bandwidth (eight flows per uplink, far below its capacity) where the
// planner charges every step the taper: the simulated ring equals the
// planner's on the untapered fat-tree.
TEST(SimComm, AnIdleRingDoesNotPayTheTaper) {
    const plan::Cluster c = cluster_of("H100-SXM", 512, "fat-tree-2to1");
    const Fabric f(c);
    const double ring = simulate_one(f, range(0, 512), Op::all_reduce, plan::Algo::ring, kGiB);
    plan::Cluster ca = c;
    ca.algo = plan::Algo::ring;
    EXPECT_LT(ring, 0.75 * plan::all_reduce_s(ca, plan::Group{512, 1}, kGiB));
    ca.topo = plan::topology("fat-tree");
    EXPECT_NEAR(ring / plan::all_reduce_s(ca, plan::Group{512, 1}, kGiB), 1.0, 1e-9);
}

// All-to-all fills the uplinks: 8 leaves of 16 devices (two nodes), 2:1
// taper, 128 ranks. Each leaf sends 16 x 112/128 S across an uplink of
// 8 NICs: 1.75 S / NIC, close to the planner's 120/128 S / (NIC / 2). A
// latency per peer node: 15 of them.
TEST(SimComm, AllToAllPaysTheTaper) {
    plan::Cluster c = cluster_of("H100-SXM", 128, "fat-tree");
    c.topo = plan::Topology{"small-2to1", {{"leaf", 16, 1.0, 1e-6}, {"spine", 0, 0.5, 2e-6}}, ""};
    const Fabric f(c);
    const double bytes = 64e6, nic = c.inter.bw * c.inter.efficiency;
    const double a2a = simulate_one(f, range(0, 128), Op::all_to_all, plan::Algo::ring, bytes);
    EXPECT_NEAR(a2a, 15 * (c.inter.latency + 2e-6) + 1.75 * bytes / nic, 1e-12);
    EXPECT_NEAR(a2a / alpha_beta_s(c, 128, Op::all_to_all, plan::Algo::ring, bytes), 0.93, 0.01);
}

// Dragonfly+: four groups of 16 devices, the global links of a group
// tapered 2:1 and split over the three other groups (16 x NIC x 0.5 / 3
// each way). An all-to-all over all 64 devices sends 16 x 16/64 S between
// each pair of groups: 1.5 S / NIC on its global link, where a NIC carries
// only 56/64 S. A ring between two groups crosses them with one flow a step.
TEST(SimComm, DragonflyGlobalLinksLimitAllToAll) {
    plan::Cluster c = cluster_of("H100-SXM", 64, "dragonfly+");
    c.topo = plan::Topology{"dragonfly+", {{"group", 16, 1.0, 1e-6}, {"global", 0, 0.5, 3e-6}}, ""};
    const Fabric f(c);
    const double bytes = 64e6, nic = c.inter.bw * c.inter.efficiency;
    const FlowStats a2a = simulate_flows(
        f, {collective_steps(f, range(0, 64), Op::all_to_all, plan::Algo::ring, bytes)});
    // A latency per peer node: 7 of them.
    EXPECT_NEAR(a2a.finish_s[0], 7 * (c.inter.latency + 3e-6) + 1.5 * bytes / nic, 1e-12);
    EXPECT_EQ(a2a.hottest_switch.rfind("global group", 0), 0u) << a2a.hottest_switch;
    EXPECT_NEAR(a2a.hottest_switch_peak, 1.0, 1e-9);
    // One rank per node on nodes 0 and 2 (groups 0 and 1): the NIC's full bandwidth.
    const double ring = simulate_one(f, {0, 16}, Op::all_reduce, plan::Algo::ring, bytes);
    EXPECT_NEAR(ring, 2 * (c.inter.latency + 3e-6 + bytes / 2 / nic), 1e-12);
}

TEST(SimComm, PlacementsKeepJobsApartAsPromised) {
    const plan::Cluster c = cluster_of("H100-SXM", 1024, "fat-tree-2to1");
    const Fabric f(c);
    const std::vector<long long> sizes = {64, 200, 64};
    auto nodes_of = [&](const std::vector<long long>& d) {
        std::set<int> s;
        for (long long x : d) s.insert(f.node_of(x));
        return s.size();
    };
    const auto packed = place(f, sizes, Placement::packed);
    EXPECT_EQ(packed[0], range(0, 64));
    EXPECT_EQ(nodes_of(packed[1]), 25u);
    const auto spread = place(f, sizes, Placement::spread);
    EXPECT_EQ(nodes_of(spread[0]), 64u);
    const auto topo = place(f, sizes, Placement::topology);
    for (const auto& d : topo) {
        std::set<long long> leaves;
        for (long long x : d) leaves.insert(x / 256);
        EXPECT_EQ(leaves.size(), 1u);  // each job inside one leaf
        EXPECT_EQ(nodes_of(d), size_t((d.size() + 7) / 8));
    }
    const auto rnd = place(f, sizes, Placement::random, 3);
    std::set<long long> all;
    for (const auto& d : rnd) all.insert(d.begin(), d.end());
    EXPECT_EQ(all.size(), 328u);
    EXPECT_THROW(place(f, {1000, 100}, Placement::packed), ConfigError);
}

// Eight all-to-all jobs filling a 2:1 fat-tree of four leaves: spread
// placement sends every job across the leaves, whose uplinks then carry
// 256 x 3/4 S on 128 NICs' worth (1.5 S / NIC, more than a NIC's S);
// topology-aware placement keeps each job inside a leaf (120/128 S / NIC).
// A latency per peer node: spread, one rank on each of 128 nodes, pays 127;
// packed in a leaf, 16 nodes, 15.
TEST(SimComm, TopologyAwarePlacementAvoidsSharedUplinks) {
    const plan::Cluster c = cluster_of("H100-SXM", 1024, "fat-tree-2to1");
    const Fabric f(c);
    const std::vector<long long> sizes(8, 128);
    auto run = [&](Placement p) {
        std::vector<std::vector<Step>> jobs;
        for (const auto& d : place(f, sizes, p)) {
            jobs.push_back(collective_steps(f, d, Op::all_to_all, plan::Algo::ring, 64e6));
        }
        const auto t = simulate_flows(f, jobs).finish_s;
        return *std::max_element(t.begin(), t.end());
    };
    const double nic = c.inter.bw * c.inter.efficiency;
    EXPECT_NEAR(run(Placement::spread), 127 * (c.inter.latency + 2e-6) + 1.5 * 64e6 / nic, 1e-9);
    EXPECT_NEAR(run(Placement::topology), 15 * (c.inter.latency + 1e-6) + 120.0 / 128 * 64e6 / nic,
                1e-9);
}

}  // namespace
}  // namespace apiary::sim
