// Carbon-aware starts and spot capacity: shifting never moves a job past
// its deadline and lowers CO2 on a profile with a low-carbon window; spot
// reclaims preempt exactly the jobs on the reclaimed nodes, which pay the
// spot price of the hours they ran.

#include <gtest/gtest.h>

#include <cmath>

#include "core/rng.h"
#include "sim_test_util.h"

namespace apiary::sim {
namespace {

// 500 gCO2e/kWh except hours 2-5 of each day at 50.
Profile low_window() {
    std::vector<double> v(24, 500);
    for (int h = 2; h < 6; ++h) v[size_t(h)] = 50;
    return Profile(3600, v);
}

std::vector<SimJob> flexible_trace(int n, double slack_h) {
    const core::Philox rng(5, 2);
    std::vector<SimJob> jobs;
    for (int i = 0; i < n; ++i) {
        const double submit = rng.uniform_f64(3 * uint64_t(i)) * 48 * 3600;
        const double runtime = (1 + 2 * rng.uniform_f64(3 * uint64_t(i) + 1)) * 3600;
        jobs.push_back(test::job(std::to_string(i), submit, 1 + i % 4, runtime));
        SimJob& j = jobs.back();
        j.spec.flexible = i % 3 != 0;  // a third must run now
        j.spec.deadline = submit + runtime + slack_h * 3600 * rng.uniform_f64(3 * uint64_t(i) + 2);
    }
    return jobs;
}

double total_co2(const SimResult& r) {
    double g = 0;
    for (const auto& o : r.jobs) g += o.co2_g;
    return g;
}

TEST(SimCarbon, ShiftingMeetsDeadlinesAndCutsCo2) {
    const auto jobs = flexible_trace(60, 20);
    SimConfig cfg = test::cluster(16, 4);  // room for everything: no queueing
    cfg.carbon = low_window();
    const SimResult base = simulate(jobs, cfg, parse_policy("backfill"));
    const SimResult shifted = simulate(jobs, cfg, parse_policy("backfill+carbon"));
    int moved = 0;
    for (size_t j = 0; j < jobs.size(); ++j) {
        const auto& o = shifted.jobs[j];
        const auto& s = jobs[j].spec;
        ASSERT_EQ(o.state, JobState::completed);
        EXPECT_LE(o.end, s.deadline + 1e-6) << "job " << s.id;
        if (!s.flexible) {
            EXPECT_DOUBLE_EQ(o.start, s.submit) << "job " << s.id;
        }
        moved += o.start > s.submit + 1;
        EXPECT_DOUBLE_EQ(base.jobs[j].start, s.submit);
    }
    EXPECT_GT(moved, 10);
    EXPECT_LT(total_co2(shifted), 0.7 * total_co2(base))
        << total_co2(shifted) << " vs " << total_co2(base);
}

// On a busy cluster jobs may still finish late (they queue after their
// hold), but a hold never ends later than deadline - run time.
TEST(SimCarbon, HoldNeverEndsPastTheLatestStart) {
    const auto jobs = flexible_trace(200, 10);
    SimConfig cfg = test::cluster(2, 4);
    cfg.carbon = low_window();
    const SimResult r = simulate(jobs, cfg, parse_policy("fifo+carbon"));
    int held = 0;
    for (size_t j = 0; j < jobs.size(); ++j) {
        const auto& s = jobs[j].spec;
        const auto& o = r.jobs[j];
        if (o.eligible > s.submit) {
            ++held;
            EXPECT_LE(o.eligible + s.runtime, s.deadline + 1e-6) << "job " << s.id;
        }
    }
    EXPECT_GT(held, 20);
}

// The best start of one job is the start of the low window when the
// deadline allows it, and as close to it as the deadline allows otherwise.
TEST(SimCarbon, HoldsUntilTheLowWindow) {
    std::vector<SimJob> jobs = {test::job("fits", 0, 1, 3600), test::job("tight", 0, 1, 3600)};
    jobs[0].spec.flexible = jobs[1].spec.flexible = true;
    jobs[0].spec.deadline = 12 * 3600;
    jobs[1].spec.deadline = 2.5 * 3600;  // latest start 1.5 h: half its hour can be in the window
    SimConfig cfg = test::cluster(2, 1);
    cfg.carbon = low_window();
    const SimResult r = simulate(jobs, cfg, parse_policy("fifo+carbon"));
    EXPECT_DOUBLE_EQ(r.jobs[0].start, 2 * 3600);
    EXPECT_NEAR(r.jobs[0].co2_g, 50.0 * 1.0, 1e-9);  // 1 kW for 1 h at 50 g/kWh
    // As late as it may: half an hour at 500, half an hour at 50.
    EXPECT_DOUBLE_EQ(r.jobs[1].start, 1.5 * 3600);
    EXPECT_NEAR(r.jobs[1].co2_g, 500 * 0.5 + 50 * 0.5, 1e-9);
}

// Spot capacity: two 4-device nodes in hour 0, none in hour 1, two again
// in hour 2 (the profile repeats every 3 h), at $1, $1 and $2 per device-hour.
TEST(SimSpot, ReclaimPreemptsAndThePriceFollowsTheProfile) {
    std::vector<SimJob> jobs = {test::job("spot", 0, 8, 2 * 3600),
                                test::job("ondemand", 0, 4, 3 * 3600)};
    jobs[0].spec.spot = true;
    jobs[0].cost.ckpt_interval_s = 1800;  // free checkpoints every 30 min: nothing lost at 1 h
    SimConfig cfg = test::cluster(1, 4);
    cfg.spot_nodes_max = 2;
    cfg.spot_nodes = Profile(3600, {2, 0, 2});
    cfg.spot_price = Profile(3600, {1, 1, 2});
    cfg.price_hour = 3;
    const SimResult r = simulate(jobs, cfg, parse_policy("fifo"));
    const auto& spot = r.jobs[0];
    EXPECT_EQ(spot.preemptions, 1);
    EXPECT_EQ(r.spot_reclaims, 2);
    EXPECT_DOUBLE_EQ(spot.start, 0);
    EXPECT_DOUBLE_EQ(spot.end, 3 * 3600);
    EXPECT_DOUBLE_EQ(spot.lost_device_s, 0);
    EXPECT_DOUBLE_EQ(spot.cost_usd, 8 * (1.0 + 2.0));
    const auto& od = r.jobs[1];
    EXPECT_EQ(od.preemptions, 0);
    EXPECT_DOUBLE_EQ(od.end, 3 * 3600);
    EXPECT_DOUBLE_EQ(od.cost_usd, 4 * 3 * 3.0);
}

TEST(SimSpot, JobsThatCanNeverFitAreRejectedWithAReason) {
    Trace t;
    t.jobs.resize(3);
    t.jobs[0].id = "big", t.jobs[0].devices = 9, t.jobs[0].runtime = 10;
    t.jobs[1].id = "spot", t.jobs[1].devices = 1, t.jobs[1].runtime = 10, t.jobs[1].spot = true;
    t.jobs[2].id = "ok", t.jobs[2].devices = 8, t.jobs[2].runtime = 10;
    const core::Config base = test::config({"cluster.device=H100-SXM", "cluster.gpus=8"});
    JobModel model(base, plan::cluster_from(base, 8), 3600);
    const auto jobs = prepare_jobs(t, model, test::cluster(1, 8));
    EXPECT_EQ(jobs[0].reject, "needs 9 devices but the cluster has 8 (1 nodes x 8)");
    EXPECT_NE(jobs[1].reject.find("no spot capacity"), std::string::npos);
    EXPECT_EQ(jobs[2].reject, "");
    const SimResult r = simulate(jobs, test::cluster(1, 8), parse_policy("fifo"));
    EXPECT_EQ(r.jobs[0].state, JobState::rejected);
    EXPECT_EQ(r.jobs[2].state, JobState::completed);
}

}  // namespace
}  // namespace apiary::sim
