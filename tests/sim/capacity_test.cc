// Capacity over time: the three CSV kinds merged into one timeline (hand
// computed), their bad input, drain against down in the simulation, and the
// capacity a hand-made log implies.

#include "sim/capacity.h"

#include <gtest/gtest.h>

#include <sstream>

#include "sim/cluster_sim.h"
#include "sim/slurm.h"
#include "sim_test_util.h"

namespace apiary::sim {
namespace {

using test::error_of;

std::vector<std::pair<double, long long>> pairs(const std::vector<CapacityStep>& s) {
    std::vector<std::pair<double, long long>> v;
    for (const auto& x : s) v.emplace_back(x.t, x.nodes);
    return v;
}

TEST(SimCapacity, LevelsEventsAndReservationsMerge) {
    CapacityInput in;
    parse_capacity_csv("time,available_nodes\n0,8\n100,12\n", "lv.csv", in);
    parse_capacity_csv("time,event,nodes\n50,drain,n[1-2]\n150,resume,n1\n", "ev.csv", in);
    parse_capacity_csv("start,end,nodes\n120,200,3\n", "res.csv", in);
    ASSERT_EQ(in.events.size(), 2u);
    EXPECT_EQ(in.events[0].nodes, (std::vector<std::string>{"n1", "n2"}));
    // 10 nodes: level capped at 10, less named nodes out, less reserved.
    const auto t = capacity_timeline(in, 10);
    const std::vector<std::pair<double, long long>> want = {{0, 8},   {50, 6},  {100, 8},
                                                            {120, 5}, {150, 6}, {200, 9}};
    EXPECT_EQ(pairs(t), want);
    std::ostringstream csv;
    write_capacity_csv(t, csv);
    EXPECT_EQ(csv.str(), "time,available_nodes\n0,8\n50,6\n100,8\n120,5\n150,6\n200,9\n");
    CapacityInput z;
    parse_capacity_csv("time,event,nodes\n5,down,\"nid[008-010],login\"\n", "z.csv", z);
    EXPECT_EQ(z.events[0].nodes, (std::vector<std::string>{"nid008", "nid009", "nid010", "login"}));
    EXPECT_TRUE(capacity_timeline(z, 4)[1].hard);
    EXPECT_EQ(capacity_timeline(z, 4)[1].nodes, 0);
}

TEST(SimCapacity, BadInputNamesFileLineAndField) {
    struct Case {
        std::string text, expect;
    };
    const std::vector<Case> cases = {
        {"when,nodes\n", "c.csv:1: header 'when,nodes' is not one of"},
        {"time,available_nodes\n0,8\n-5,4\n", "c.csv:3: field 'time': '-5' is negative"},
        {"time,available_nodes\n10,8\n5,4\n", "c.csv:3: field 'time': '5' is before the previous"},
        {"time,available_nodes\n0,eight\n", "c.csv:2: field 'available_nodes': 'eight' is not a"},
        {"time,available_nodes\n0,8,9\n", "c.csv:2: 3 cells but the header has 2 fields"},
        {"time,event,nodes\n0,fail,n1\n", "c.csv:2: field 'event': 'fail' is not drain, down"},
        {"time,event,nodes\n0,drain,n[5-2]\n", "c.csv:2: field 'nodes': 'n[5-2]' has a bad range"},
        {"start,end,nodes\n100,50,2\n", "c.csv:2: field 'end': '50' is not after start 100"},
        {"start,end,nodes\n0,50,0\n", "c.csv:2: field 'nodes': '0' is too small"},
        {"# nothing\n", "c.csv: no header line"},
    };
    for (const auto& c : cases) {
        CapacityInput in;
        const std::string e = error_of([&] { parse_capacity_csv(c.text, "c.csv", in); });
        EXPECT_NE(e.find(c.expect), std::string::npos) << "got: " << e << "\nwant: " << c.expect;
    }
}

TEST(SimCapacity, DrainWaitsForJobsDownStopsThem) {
    // Two 1-node jobs run 0..100 on 2 nodes; at t = 10 one node goes.
    auto jobs = std::vector<SimJob>{test::job("a", 0, 1, 100), test::job("b", 0, 1, 100),
                                    test::job("c", 20, 1, 10)};
    for (auto& j : jobs) j.cost.ckpt_interval_s = kNever;  // a stopped run loses all its work
    SimConfig cfg = test::cluster(2, 1);
    cfg.capacity = {{0, 2, false}, {10, 1, false}};
    SimResult r = simulate(jobs, cfg, parse_policy("fifo"));
    // Drain: a and b finish undisturbed; one node is gone after, c gets the other.
    EXPECT_DOUBLE_EQ(r.jobs[0].end, 100);
    EXPECT_DOUBLE_EQ(r.jobs[1].end, 100);
    EXPECT_EQ(r.jobs[0].failures + r.jobs[1].failures, 0);
    EXPECT_DOUBLE_EQ(r.jobs[2].start, 100);
    // Down: one of them stops at 10 and requeues ahead of c (submit order).
    cfg.capacity = {{0, 2, false}, {10, 1, true}};
    r = simulate(jobs, cfg, parse_policy("fifo"));
    EXPECT_EQ(r.jobs[0].failures + r.jobs[1].failures, 1);
    const int stopped = r.jobs[0].failures == 1 ? 0 : 1;
    EXPECT_DOUBLE_EQ(r.jobs[size_t(1 - stopped)].end, 100);
    EXPECT_DOUBLE_EQ(r.jobs[size_t(stopped)].end, 200);  // restarted from scratch at 100
    EXPECT_DOUBLE_EQ(r.jobs[2].start, 200);
    // Back to 2 nodes at 15, before the drain took a node: nothing changes.
    cfg.capacity = {{0, 2, false}, {10, 1, false}, {15, 2, false}};
    r = simulate(jobs, cfg, parse_policy("fifo"));
    EXPECT_DOUBLE_EQ(r.jobs[2].start, 100);  // the drain was cancelled, both nodes busy
    // Both nodes down from 10 to 50: both jobs stop and rerun from 50.
    cfg.capacity = {{0, 2, false}, {10, 0, true}, {50, 2, false}};
    r = simulate(jobs, cfg, parse_policy("fifo"));
    EXPECT_DOUBLE_EQ(r.jobs[0].start, 0);
    EXPECT_DOUBLE_EQ(r.jobs[0].end, 150);
    EXPECT_DOUBLE_EQ(r.jobs[2].start, 150);
}

TEST(SimCapacity, ImpliedByALog) {
    // 4 nodes. j1 runs 0..1000 on 2 nodes; j2 (1 node) is queued from 100
    // and starts only at 5000 though 2 nodes were free: an outage, its
    // capacity what was running (2, then 0 once j1 ends), back to 4 at 5000.
    Trace t;
    auto add = [&](const char* id, double submit, long long n, double start, double end) {
        JobSpec j;
        j.id = id;
        j.submit = submit;
        j.devices = n;
        j.recorded_start = start;
        j.recorded_end = end;
        t.jobs.push_back(j);
    };
    add("j1", 0, 2, 0, 1000);
    add("j2", 100, 1, 5000, 5100);
    add("j3", 6000, 4, 6000, 7000);
    int outages = -1;
    auto steps = implied_capacity(t, 4, 3600, &outages);
    const std::vector<std::pair<double, long long>> want = {{0, 4}, {100, 2}, {1000, 0}, {5000, 4}};
    EXPECT_EQ(pairs(steps), want);
    EXPECT_EQ(outages, 1);
    steps = implied_capacity(t, 4, 10000, &outages);  // too short to count
    EXPECT_EQ(pairs(steps), (std::vector<std::pair<double, long long>>{{0, 4}}));
    EXPECT_EQ(outages, 0);
}

}  // namespace
}  // namespace apiary::sim

namespace apiary::sim {
namespace {

TEST(SimCapacity, SlurmNodeEvents) {
    // The trace starts at 2026-12-01T00:00:00 (Unix 1796083200): nid[01-02]
    // drain from 1 h to 3 h, nid03 is down from 2 h and not back; a cluster
    // event without nodes is skipped.
    const std::string text =
        "Cluster|NodeName|TimeStart|TimeEnd|State|Reason\n"
        "c|nid[01-02]|2026-12-01T01:00:00|2026-12-01T03:00:00|DRAIN|maint\n"
        "c|nid03|2026-12-01T02:00:00|Unknown|DOWN|dead\n"
        "c||2026-12-01T00:00:00|Unknown||cluster registered\n";
    CapacityInput in;
    parse_capacity_csv(text, "ev.txt", in, parse_slurm_time("2026-12-01T00:00:00", "t"));
    const auto t = capacity_timeline(in, 10);
    const std::vector<std::pair<double, long long>> want = {
        {0, 10}, {3600, 8}, {7200, 7}, {10800, 9}};
    EXPECT_EQ(pairs(t), want);
    EXPECT_FALSE(t[1].hard);
    EXPECT_TRUE(t[2].hard);
    CapacityInput bad;
    EXPECT_NE(error_of([&] {
                  parse_capacity_csv("NodeName|TimeStart|State\nn1|2026-12-01T01:00:00|DOWN\n",
                                     "e.txt", bad);
              }).find("e.txt:1: sacctmgr events without a 'TimeEnd' field"),
              std::string::npos);
    EXPECT_NE(error_of([&] {
                  parse_capacity_csv("NodeName|TimeStart|TimeEnd|State\nn1|soon|Unknown|DOWN\n",
                                     "e.txt", bad);
              }).find("e.txt:2: field 'TimeStart'"),
              std::string::npos);
}

}  // namespace
}  // namespace apiary::sim
