// Scheduling policies of the cluster simulator: gang allocation never runs
// part of a job, EASY backfill never delays the reserved job, preemption and
// failures cost exactly the work since the last checkpoint, fair share
// between accounts, time limits and Slurm's completing delay.

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "core/error.h"
#include "core/rng.h"
#include "sim/report.h"
#include "sim_test_util.h"

namespace apiary::sim {
namespace {

// A mixed trace: sizes 1 to 32 devices, runtimes 10 s to 2 h, time limits
// 1-3x the runtime, arrivals bunched so that queues form.
std::vector<SimJob> mixed_trace(int n, uint64_t seed) {
    const core::Philox rng(seed, 1);
    std::vector<SimJob> jobs;
    double t = 0;
    for (int i = 0; i < n; ++i) {
        const uint64_t k = 4 * uint64_t(i);
        t += -std::log1p(-rng.uniform_f64(k)) * 120;
        const long long devices = 1LL << rng.below(k + 1, 6);
        const double runtime = 10 * std::exp(rng.uniform_f64(k + 2) * std::log(720.0));
        const double limit = runtime * (1 + 2 * rng.uniform_f64(k + 3));
        jobs.push_back(test::job(std::to_string(i), t, devices, runtime, limit));
    }
    return jobs;
}

// No device holds two runs at once, and every run holds exactly its job's devices.
void expect_gang(const std::vector<SimJob>& jobs, const SimResult& r) {
    std::map<int32_t, std::vector<std::pair<double, double>>> by_slot;
    for (const auto& s : r.segments) {
        const long long want = jobs[size_t(s.job)].spec.devices;
        std::set<int32_t> distinct(r.slots.begin() + s.slot_begin,
                                   r.slots.begin() + s.slot_begin + s.slot_count);
        ASSERT_EQ((long long)distinct.size(), want) << "job " << jobs[size_t(s.job)].spec.id;
        for (int32_t slot : distinct) by_slot[slot].emplace_back(s.start, s.end);
    }
    for (auto& [slot, spans] : by_slot) {
        std::sort(spans.begin(), spans.end());
        for (size_t i = 1; i < spans.size(); ++i) {
            ASSERT_LE(spans[i - 1].second, spans[i].first + 1e-9) << "slot " << slot;
        }
    }
}

TEST(SimScheduler, GangAllocationNeverRunsPartOfAJob) {
    const auto jobs = mixed_trace(400, 3);
    SimConfig cfg = test::cluster(8, 8);
    cfg.mtbf_node_s = 20 * 3600;  // failures stop whole jobs, never a part
    cfg.repair_s = 1800;
    for (const char* p : {"fifo", "backfill", "twolevel+preempt"}) {
        const SimResult r = simulate(jobs, cfg, parse_policy(p));
        SCOPED_TRACE(p);
        expect_gang(jobs, r);
        EXPECT_GT(r.node_failures, 0);
        int restarted = 0;
        for (size_t j = 0; j < jobs.size(); ++j) {
            EXPECT_EQ(r.jobs[j].state, JobState::completed);
            restarted += r.jobs[j].failures > 0;
        }
        EXPECT_GT(restarted, 0);
    }
}

TEST(SimScheduler, BackfillNeverDelaysTheReservedJob) {
    const auto jobs = mixed_trace(600, 11);
    const SimConfig cfg = test::cluster(4, 8);
    const SimResult r = simulate(jobs, cfg, parse_policy("backfill"));
    expect_gang(jobs, r);
    int reserved = 0, overtaken = 0;
    for (size_t j = 0; j < jobs.size(); ++j) {
        const auto& o = r.jobs[j];
        if (o.reservation >= 0) {
            ++reserved;
            EXPECT_LE(o.start, o.reservation + 1e-6) << "job " << jobs[j].spec.id;
        }
        // Backfill did happen: a job started before one submitted earlier.
        if (j > 0 && o.start < r.jobs[j - 1].start) ++overtaken;
    }
    EXPECT_GT(reserved, 50);
    EXPECT_GT(overtaken, 50);
    // FIFO keeps the order exactly.
    const SimResult f = simulate(jobs, cfg, parse_policy("fifo"));
    for (size_t j = 1; j < jobs.size(); ++j) EXPECT_GE(f.jobs[j].start, f.jobs[j - 1].start);
}

// Backfill helps: the same trace waits less on average than under FIFO.
TEST(SimScheduler, BackfillWaitsLessThanFifo) {
    const auto jobs = mixed_trace(600, 11);
    const SimConfig cfg = test::cluster(4, 8);
    auto mean_wait = [&](const char* p) {
        const SimResult r = simulate(jobs, cfg, parse_policy(p));
        double w = 0;
        for (const auto& o : r.jobs) w += o.start - o.eligible;
        return w / double(jobs.size());
    };
    EXPECT_LT(mean_wait("backfill"), 0.8 * mean_wait("fifo"));
}

// A long low-priority job is preempted by a high-priority one that needs the
// whole cluster: it loses its work since the last checkpoint and pays the
// restart. Checkpoints every 300 s of work, each 10 s; restart 50 s.
TEST(SimScheduler, PreemptionLosesWorkSinceTheLastCheckpoint) {
    std::vector<SimJob> jobs = {test::job("low", 0, 4, 1000), test::job("high", 500, 4, 200)};
    jobs[0].cost.ckpt_interval_s = 300;
    jobs[0].cost.ckpt_s = 10;
    jobs[1].spec.priority = 1;
    SimConfig cfg = test::cluster(1, 4);
    cfg.restart_s = 50;
    const SimResult r = simulate(jobs, cfg, parse_policy("priority+preempt"));
    const auto& low = r.jobs[0];
    const auto& high = r.jobs[1];
    EXPECT_DOUBLE_EQ(high.start, 500);
    EXPECT_DOUBLE_EQ(high.end, 700);
    // At 500 s: one 300 s interval and its 10 s checkpoint done (310 s), 190 s lost.
    EXPECT_EQ(low.preemptions, 1);
    EXPECT_DOUBLE_EQ(low.lost_device_s, 4 * 190.0);
    // Back at 700 s: 50 s restart, 700 s of work left with two checkpoints.
    EXPECT_DOUBLE_EQ(low.end, 700 + 50 + 700 + 2 * 10);
    EXPECT_DOUBLE_EQ(low.device_s, 4 * (500.0 + 770));
    EXPECT_DOUBLE_EQ(low.overhead_device_s, 4 * (10.0 + 50 + 20));
    // Without preemption the high-priority job waits for the low one.
    const SimResult q = simulate(jobs, cfg, parse_policy("priority"));
    EXPECT_DOUBLE_EQ(q.jobs[1].start, 1000 + 3 * 10);
}

TEST(SimScheduler, ProgressClosedForms) {
    // restart 50, work 1000, every 300 s a 10 s checkpoint.
    EXPECT_DOUBLE_EQ(run_duration(50, 1000, 300, 10), 50 + 1000 + 3 * 10);
    EXPECT_DOUBLE_EQ(run_duration(0, 900, 300, 10), 900 + 2 * 10);  // none at the very end
    EXPECT_DOUBLE_EQ(run_duration(0, 100, 300, 10), 100);
    Progress p = progress_at(40, 50, 1000, 300, 10);  // still restarting
    EXPECT_DOUBLE_EQ(p.saved, 0);
    EXPECT_DOUBLE_EQ(p.lost, 0);
    p = progress_at(50 + 625, 50, 1000, 300, 10);  // 5 s into the third interval
    EXPECT_DOUBLE_EQ(p.saved, 600);
    EXPECT_DOUBLE_EQ(p.lost, 5);
    p = progress_at(50 + 305, 50, 1000, 300, 10);  // during the first checkpoint
    EXPECT_DOUBLE_EQ(p.saved, 0);
    EXPECT_DOUBLE_EQ(p.lost, 305);
    p = progress_at(500, 0, 1000, 0, 0);  // continuous: nothing lost
    EXPECT_DOUBLE_EQ(p.saved, 500);
    EXPECT_DOUBLE_EQ(p.lost, 0);
}

// Account "a" floods the queue first; under the two-level queue account
// "b"'s later jobs go ahead of a's backlog, under FIFO they wait behind it.
TEST(SimScheduler, FairShareLetsALightAccountAhead) {
    std::vector<SimJob> jobs;
    for (int i = 0; i < 20; ++i) {
        jobs.push_back(test::job("a" + std::to_string(i), i, 4, 1000));
        jobs.back().spec.account = "a";
    }
    for (int i = 0; i < 3; ++i) {
        jobs.push_back(test::job("b" + std::to_string(i), 100 + i, 4, 1000));
        jobs.back().spec.account = "b";
    }
    const SimConfig cfg = test::cluster(1, 4);
    auto b_wait = [&](const char* p) {
        const SimResult r = simulate(jobs, cfg, parse_policy(p));
        double w = 0;
        for (size_t j = 20; j < jobs.size(); ++j) w += r.jobs[j].start - r.jobs[j].eligible;
        return w / 3;
    };
    EXPECT_LT(b_wait("twolevel"), 4000);
    EXPECT_GT(b_wait("fifo"), 18000);
    // Within one account the two-level queue keeps submit order.
    const SimResult r = simulate(jobs, cfg, parse_policy("twolevel"));
    for (int i = 1; i < 20; ++i) EXPECT_GT(r.jobs[size_t(i)].start, r.jobs[size_t(i) - 1].start);
}

TEST(SimScheduler, TimeLimitEndsARun) {
    std::vector<SimJob> jobs = {test::job("long", 0, 1, 500, 300), test::job("next", 1, 1, 10)};
    const SimResult r = simulate(jobs, test::cluster(1, 1), parse_policy("fifo"));
    EXPECT_EQ(r.jobs[0].state, JobState::timeout);
    EXPECT_DOUBLE_EQ(r.jobs[0].end, 300);
    EXPECT_DOUBLE_EQ(r.jobs[1].start, 300);
}

// The scheduler's latency delays a job's first chance to start, and the
// reuse of the devices a run held; the devices are not busy in between
// (utilisation and device-hours count the runs only).
TEST(SimScheduler, LatencyDelaysArrivalsAndReleases) {
    std::vector<SimJob> jobs = {test::job("first", 0, 2, 5), test::job("second", 0, 2, 5)};
    SimConfig cfg = test::cluster(1, 2);
    cfg.latency_s = 1;
    const SimResult r = simulate(jobs, cfg, parse_policy("fifo"));
    EXPECT_DOUBLE_EQ(r.jobs[0].start, 1);
    EXPECT_DOUBLE_EQ(r.jobs[0].end, 6);
    EXPECT_DOUBLE_EQ(r.jobs[1].start, 7);
    EXPECT_DOUBLE_EQ(r.jobs[1].start - jobs[1].spec.submit, 7);  // the wait counts it
    EXPECT_DOUBLE_EQ(r.busy_device_s, 2 * 5 + 2 * 5.0);          // not 2 x (5 + 1) each
    EXPECT_DOUBLE_EQ(r.jobs[0].device_s, 2 * 5.0);
}

// Fragmentation: a 3-device job leaves one device of its 4-device node
// free, too few for a 2-device job, which waits; the idle devices on partly
// busy nodes are counted.
TEST(SimScheduler, FragmentedDevicesAreCounted) {
    std::vector<SimJob> jobs = {test::job("three", 0, 3, 100), test::job("four", 0, 4, 100),
                                test::job("two", 0, 2, 50)};
    const SimResult r = simulate(jobs, test::cluster(2, 4), parse_policy("fifo"));
    EXPECT_DOUBLE_EQ(r.jobs[2].start, 100);
    // 0-100: node 0 has 1 free of 4 (fragmented); 100-150: "two" on a node
    // leaves 2 free beside it, the other node wholly free (not counted).
    EXPECT_DOUBLE_EQ(r.fragmented_device_s, 1 * 100 + 2 * 50.0);
    const Summary s = summarize(jobs, r);
    EXPECT_DOUBLE_EQ(s.fragmented_device_hours, 200 / 3600.0);
    // Idle device-time: 1 x 100 + 6 x 50 = 400 s, of which 200 fragmented.
    EXPECT_DOUBLE_EQ(s.fragmented_idle_share, 0.5);
}

// Leaf switches of 4 nodes: a 2-node and a 1-node job fill leaf 0 best-fit,
// so a 4-node job finds leaf 1 whole; without leaves the same jobs take
// nodes from the top down and the 4-node job straddles both leaves.
TEST(SimScheduler, JobsStayInsideALeafWhenOneHasRoom) {
    std::vector<SimJob> jobs = {test::job("a", 0, 2, 100), test::job("b", 0, 1, 100),
                                test::job("c", 0, 4, 100)};
    SimConfig c = test::cluster(8, 1);
    auto nodes_of = [](const SimResult& r, int j) {
        std::set<int32_t> n;
        for (const Segment& s : r.segments) {
            if (s.job == j)
                n.insert(r.slots.begin() + s.slot_begin,
                         r.slots.begin() + s.slot_begin + s.slot_count);
        }
        return n;
    };
    c.nodes_per_leaf = 4;
    SimResult r = simulate(jobs, c, parse_policy("fifo"));
    EXPECT_EQ(r.leaf_fit_runs, 3);
    EXPECT_EQ(r.leaf_split_runs, 0);
    EXPECT_EQ(nodes_of(r, 2), (std::set<int32_t>{4, 5, 6, 7}));
    c.nodes_per_leaf = 0;
    r = simulate(jobs, c, parse_policy("fifo"));
    EXPECT_EQ(r.leaf_fit_runs, 0);  // not counted without leaves
    const auto spread = nodes_of(r, 2);
    EXPECT_TRUE(*spread.begin() < 4 && *spread.rbegin() >= 4) << "expected to straddle";
}

// At the horizon the simulation stops: a run still going is accounted up to
// it and its job is reported unfinished; a job that never started too.
TEST(SimScheduler, HorizonStopsWithUnfinishedJobs) {
    std::vector<SimJob> jobs = {test::job("long", 0, 2, 10 * 3600), test::job("next", 0, 2, 60)};
    SimConfig cfg = test::cluster(1, 2);
    cfg.horizon_s = 5 * 3600;
    const SimResult r = simulate(jobs, cfg, parse_policy("fifo"));
    EXPECT_EQ(r.jobs[0].state, JobState::unfinished);
    EXPECT_DOUBLE_EQ(r.jobs[0].device_s, 2 * 5 * 3600.0);
    EXPECT_EQ(r.jobs[1].state, JobState::unfinished);
    EXPECT_LT(r.jobs[1].start, 0);
}

TEST(SimScheduler, PolicyNamesAreChecked) {
    EXPECT_TRUE(parse_policy("twolevel+preempt+carbon").preempt);
    EXPECT_THROW(parse_policy("lifo"), ConfigError);
    EXPECT_THROW(parse_policy("fifo+fast"), ConfigError);
}

}  // namespace
}  // namespace apiary::sim
