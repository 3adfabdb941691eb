// `apiary sim fit`'s search: a log recorded under a known setting is fitted
// back to that setting (score 0: equal mean and p90, Spearman 1), from
// several different generators; the grid, the score and the report's
// groups by hand.

#include "sim/fit.h"

#include <gtest/gtest.h>

#include "sim/slurm.h"
#include "sim/synth.h"
#include "sim_test_util.h"

namespace apiary::sim {
namespace {

// A synthetic log on 64 single-device nodes, "recorded" under `truth`.
struct Log {
    Trace trace;
    std::vector<SimJob> jobs;
    SimConfig base;
};
Log recorded_under(const FitSetting& truth, uint64_t seed) {
    SynthOptions o;
    o.jobs = 400;
    o.devices = 64;
    o.load = 1.1;  // queues form, so the policies differ
    o.median_runtime_s = 1800;
    o.accounts = 1;
    o.high_priority_frac = 0;
    o.seed = seed;
    Log l;
    l.trace = synthesize(o);
    l.base = test::cluster(64, 1);
    l.base.record = false;
    for (const auto& s : l.trace.jobs) {
        l.jobs.push_back(test::job(s.id, s.submit, s.devices, s.runtime, s.time_limit));
    }
    SimConfig c = l.base;
    const SimResult r = simulate(l.jobs, c, apply_setting(truth, l.trace, c));
    for (size_t j = 0; j < l.jobs.size(); ++j) {
        EXPECT_GE(r.jobs[j].start, 0);
        l.jobs[j].spec.recorded_start = l.trace.jobs[j].recorded_start = r.jobs[j].start;
        l.jobs[j].spec.recorded_end = l.trace.jobs[j].recorded_end = r.jobs[j].end;
    }
    return l;
}

TEST(SimFit, RecoversTheSettingThatRecordedTheLog) {
    const auto grid = fit_grid({"fifo", "backfill", "multifactor", "wfp"}, false, false);
    FitSetting small_first;
    small_first.policy = "multifactor";
    small_first.weight_size = 1000;
    small_first.favor_small = true;
    small_first.max_age_s = 86400;
    FitSetting big_first = small_first;
    big_first.favor_small = false;
    big_first.max_age_s = 7 * 86400;
    FitSetting easy;
    easy.policy = "backfill";
    FitSetting fifo;
    fifo.policy = "fifo";
    FitSetting wfp;
    wfp.policy = "wfp";
    for (const auto& truth : {small_first, big_first, easy, fifo, wfp}) {
        const Log l = recorded_under(truth, 3);
        size_t best = 99;
        const auto tried = fit_search(l.trace, l.jobs, l.base, grid, 0, &best);
        ASSERT_EQ(tried.size(), grid.size());
        const FitTry& b = tried[best];
        EXPECT_NEAR(b.score, 0, 1e-12) << truth.name() << " -> " << b.setting.name();
        EXPECT_NEAR(b.waits.spearman, 1, 1e-12);
        EXPECT_EQ(b.waits.n, 400);
        EXPECT_EQ(b.setting.policy, truth.policy) << truth.name() << " -> " << b.setting.name();
        // Which way job size pulls is recovered; its weight against age only
        // up to settings that order this log the same way.
        if (truth.multifactor()) {
            EXPECT_EQ(b.setting.favor_small, truth.favor_small) << b.setting.name();
            EXPECT_GT(b.setting.weight_size, 0) << b.setting.name();
        }
        // The generator is in the grid, and every other setting scores worse
        // or reproduces the same waits.
        bool found = false;
        for (const auto& t : tried) found |= t.setting.name() == truth.name();
        EXPECT_TRUE(found) << truth.name();
        // Deterministic: the same search gives the same scores.
        size_t again = 0;
        const auto tried2 = fit_search(l.trace, l.jobs, l.base, grid, 0, &again);
        EXPECT_EQ(again, best);
        for (size_t i = 0; i < tried.size(); ++i) EXPECT_EQ(tried[i].score, tried2[i].score);
    }
}

TEST(SimFit, ScoreAndWaitStatsByHand) {
    std::vector<SimJob> jobs = {test::job("a", 0, 1, 10), test::job("b", 0, 1, 10),
                                test::job("c", 0, 1, 10)};
    jobs[0].spec.recorded_start = 0;
    jobs[1].spec.recorded_start = 10;
    jobs[2].spec.recorded_start = 40;
    const SimResult r = simulate(jobs, test::cluster(1, 1), parse_policy("fifo"));  // 0, 10, 20
    const WaitStats w = wait_stats(jobs, r, [](size_t) { return true; });
    EXPECT_EQ(w.n, 3);
    EXPECT_DOUBLE_EQ(w.mean, 10);
    EXPECT_DOUBLE_EQ(w.rec_mean, 50.0 / 3);
    EXPECT_DOUBLE_EQ(w.p90, 20);
    EXPECT_DOUBLE_EQ(w.rec_p90, 40);
    EXPECT_DOUBLE_EQ(w.spearman, 1);
    EXPECT_NEAR(fit_score(w), std::log(50.0 / 30) + std::log(2.0), 1e-12);
    const WaitStats only_b = wait_stats(jobs, r, [](size_t j) { return j == 1; });
    EXPECT_EQ(only_b.n, 1);
    EXPECT_TRUE(std::isinf(fit_score(wait_stats(jobs, r, [](size_t) { return false; }))));
}

TEST(SimFit, GridAndGroups) {
    // fifo 1; backfill 2 depths; multifactor 2 depths x 3 sizes x 2 ages; x 2 capacities.
    EXPECT_EQ(fit_grid({"fifo", "backfill", "multifactor"}, true, false).size(),
              size_t(2 * (1 + 2 + 12)));
    EXPECT_EQ(fit_grid({"multifactor"}, false, true).size(), size_t(24));  // fair share on/off
    // User limits: none, 1, 2, 4.
    const auto limited = fit_grid({"fifo"}, false, false, true);
    ASSERT_EQ(limited.size(), size_t(4));
    EXPECT_EQ(limited[2].name(), "--policies fifo --user-max-jobs 2");
    EXPECT_EQ(size_class(1), "1");
    EXPECT_EQ(size_class(2), "2");
    EXPECT_EQ(size_class(3), "3-4");
    EXPECT_EQ(size_class(128), "65-128");
    EXPECT_EQ(size_class(129), "129-256");
    EXPECT_EQ(month_of(1693547500, true, 0), "2023-09");
    EXPECT_EQ(month_of(1693547500, true, 40 * 86400.0), "2023-10");
    EXPECT_EQ(month_of(0, false, 65 * 86400.0), "day 60-89");
    FitSetting s;
    s.policy = "multifactor";
    s.bf_max_job_test = 10;
    s.favor_small = true;
    s.weight_size = 5000;
    s.max_age_s = 86400;
    s.implied_gap_h = 2;
    s.user_max_jobs = 3;
    EXPECT_EQ(s.name(),
              "--policies multifactor --bf-max-job-test 10 --priority-weights "
              "age=1000,size=5000,fairshare=0 --priority-favor-small --priority-max-age-days 1 "
              "--user-max-jobs 3 --capacity implied --implied-gap-hours 2");
}

// Campaigns: one size and time limit, each submission within the window of
// the previous one; a log that names its users is left alone.
TEST(SimFit, InfersUsersFromBursts) {
    Trace t;
    auto add = [&](const char* id, double submit, long long devices, double limit) {
        JobSpec j;
        j.id = id;
        j.submit = submit;
        j.devices = devices;
        j.time_limit = limit;
        j.user = "0";  // the log's one user
        t.jobs.push_back(j);
    };
    add("a", 0, 4, 100);
    add("b", 50, 4, 100);    // 50 s after a: a's campaign
    add("x", 60, 2, 100);    // another size
    add("c", 100, 4, 100);   // 50 s after b: still a's
    add("d", 200, 4, 100);   // 100 s after c: a new one
    add("e", 210, 4, 3600);  // another time limit
    EXPECT_EQ(infer_users(t, 60), 4);
    EXPECT_EQ(t.jobs[0].user, "burst:a");
    EXPECT_EQ(t.jobs[1].user, "burst:a");
    EXPECT_EQ(t.jobs[2].user, "burst:x");
    EXPECT_EQ(t.jobs[3].user, "burst:a");
    EXPECT_EQ(t.jobs[4].user, "burst:d");
    EXPECT_EQ(t.jobs[5].user, "burst:e");
    t.jobs[0].user = "alice";
    t.jobs[1].user = "bob";
    Trace named = t;
    EXPECT_EQ(infer_users(named, 60), 0);
    EXPECT_EQ(named.jobs[1].user, "bob");
}

// 4 devices on one node, backfill reserving for the first `depth` blocked
// jobs (1: EASY).
SimConfig backfill_cluster(int depth) {
    SimConfig c = test::cluster(4, 1);
    c.bf_max_job_test = depth;
    return c;
}
SimResult backfill(const std::vector<SimJob>& jobs, const SimConfig& c) {
    return simulate(jobs, c, parse_policy("backfill"));
}

// slurm.conf text, as a file s.conf would give it.
SlurmConf conf(const std::string& text) { return parse_slurm_conf(text, "s.conf", false); }

// bf_max_job_user: behind a reserved job, backfill tests one job of user u
// per pass, so u's second short job misses the hole the first one fills
// (under EASY and with two reservations alike); without the limit both go.
TEST(SimFit, BackfillTestsAtMostBfMaxJobUserJobsOfAUser) {
    std::vector<SimJob> jobs = {test::job("A", 0, 2, 100), test::job("H", 1, 4, 10),
                                test::job("b1", 2, 1, 50), test::job("b2", 2, 1, 50)};
    jobs[2].spec.user = jobs[3].spec.user = "u";
    for (int depth : {1, 2}) {
        SimConfig c = backfill_cluster(depth);
        SimResult r = backfill(jobs, c);
        EXPECT_DOUBLE_EQ(r.jobs[1].start, 100) << depth;
        EXPECT_DOUBLE_EQ(r.jobs[2].start, 2) << depth;
        EXPECT_DOUBLE_EQ(r.jobs[3].start, 2) << depth;
        c.bf_max_job_user = 1;
        r = backfill(jobs, c);
        EXPECT_DOUBLE_EQ(r.jobs[1].start, 100) << depth;
        EXPECT_DOUBLE_EQ(r.jobs[2].start, 2) << depth;
        EXPECT_DOUBLE_EQ(r.jobs[3].start, 110) << depth;  // after H: 52 + 50 passes its reservation
    }
    EXPECT_EQ(conf("SchedulerParameters=bf_max_job_user=3,bf_window=60\n").bf_max_job_user, 3);
}

// bf_min_age_reserve: a 4-device job H waiting behind a 3-device run
// reserves the whole cluster at t = 100 and keeps a long 1-device job S out
// of the free device; while H is younger than the threshold it reserves
// nothing, S starts at once, and H waits for S (EASY and two reservations).
TEST(SimFit, NoReservationBeforeBfMinAgeReserve) {
    std::vector<SimJob> jobs = {test::job("A", 0, 3, 100), test::job("H", 1, 4, 10),
                                test::job("S", 2, 1, 200)};
    for (int depth : {1, 2}) {
        SimConfig c = backfill_cluster(depth);
        SimResult r = backfill(jobs, c);
        EXPECT_DOUBLE_EQ(r.jobs[1].start, 100) << depth;
        EXPECT_DOUBLE_EQ(r.jobs[2].start, 110) << depth;
        c.bf_min_age_reserve_s = 1000;
        r = backfill(jobs, c);
        EXPECT_DOUBLE_EQ(r.jobs[2].start, 2) << depth;
        EXPECT_DOUBLE_EQ(r.jobs[1].start, 202) << depth;
        c.bf_min_age_reserve_s = 50;  // H was 1 s old when S came: S still goes first
        r = backfill(jobs, c);
        EXPECT_DOUBLE_EQ(r.jobs[2].start, 2) << depth;
    }
    EXPECT_DOUBLE_EQ(conf("SchedulerParameters=bf_min_age_reserve=600\n").bf_min_age_reserve_s,
                     600);
    EXPECT_NE(test::error_of([] {
                  conf("SchedulerParameters=bf_min_age_reserve=soon\n");
              }).find("bf_min_age_reserve=soon is not seconds >= 0"),
              std::string::npos);
}

// PriorityFavorSmall: a 1-device job queued behind a 3-device one (both
// waiting for the 4 devices a running job holds) goes first only when
// small jobs are favoured; slurm.conf sets it.
TEST(SimFit, FavorSmallTurnsTheSizeFactorAround) {
    std::vector<SimJob> jobs = {test::job("run", 0, 4, 100), test::job("big", 1, 3, 100),
                                test::job("small", 2, 1, 100)};
    SimConfig c = test::cluster(4, 1);
    c.weight_age = 0;
    c.weight_fairshare = 0;
    c.weight_size = 1000;
    auto p = parse_policy("multifactor-fifo");
    SimResult r = simulate(jobs, c, p);
    EXPECT_DOUBLE_EQ(r.jobs[1].start, 100);  // big first, small beside it
    EXPECT_DOUBLE_EQ(r.jobs[2].start, 100);
    jobs[2].spec.devices = jobs[2].cost.power_kw = 2;  // now they cannot run together
    r = simulate(jobs, c, p);
    EXPECT_DOUBLE_EQ(r.jobs[1].start, 100);
    EXPECT_DOUBLE_EQ(r.jobs[2].start, 200);
    c.favor_small = true;
    r = simulate(jobs, c, p);
    EXPECT_DOUBLE_EQ(r.jobs[2].start, 100);
    EXPECT_DOUBLE_EQ(r.jobs[1].start, 200);
    EXPECT_EQ(conf("PriorityFavorSmall=YES\n").favor_small, 1);
    EXPECT_EQ(conf("PriorityFavorSmall=no\n").favor_small, 0);
    EXPECT_NE(test::error_of([] {
                  conf("PriorityFavorSmall=big\n");
              }).find("s.conf:1: PriorityFavorSmall=big is not YES or NO"),
              std::string::npos);
}

}  // namespace
}  // namespace apiary::sim
