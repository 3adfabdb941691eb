// Slurm's multifactor priority on hand-made logs where it and FIFO give
// different orders, each worked out by hand in the comments; slurm.conf's
// priority keys and their errors.

#include <gtest/gtest.h>

#include "sim/slurm.h"
#include "sim_test_util.h"

namespace apiary::sim {
namespace {

using test::error_of;

SimJob user_job(const std::string& id, const std::string& user, double submit, long long n,
                double run) {
    SimJob j = test::job(id, submit, n, run);
    j.spec.user = user;
    return j;
}

TEST(SimPriority, JobSizeAndAgeAgainstFifo) {
    // 4 nodes; a holds all of them 0..100. b (1 node) arrives at 10, c (4
    // nodes) at 20; each runs 100 s. Under FIFO b starts at 100, c at 200.
    const std::vector<SimJob> jobs = {test::job("a", 0, 4, 100), test::job("b", 10, 1, 100),
                                      test::job("c", 20, 4, 100)};
    SimConfig cfg = test::cluster(4, 1);
    SimResult r = simulate(jobs, cfg, parse_policy("fifo"));
    EXPECT_DOUBLE_EQ(r.jobs[1].start, 100);
    EXPECT_DOUBLE_EQ(r.jobs[2].start, 200);
    // Multifactor at t = 100, age and size weights 1000, max age 1 day:
    //   b: 1000 * 90/86400 + 1000 * 1/4 = 251.04
    //   c: 1000 * 80/86400 + 1000 * 4/4 = 1000.93  -> c first.
    // Priorities recomputed at every pass (PriorityCalcPeriod 0).
    cfg.weight_age = 1000, cfg.weight_size = 1000, cfg.weight_fairshare = 0;
    cfg.priority_max_age_s = 86400;
    cfg.priority_calc_period_s = 0;
    r = simulate(jobs, cfg, parse_policy("multifactor-fifo"));
    EXPECT_DOUBLE_EQ(r.jobs[2].start, 100);
    EXPECT_DOUBLE_EQ(r.jobs[1].start, 200);
    // With backfill too (c reserves nothing: it starts; b cannot fit beside it).
    r = simulate(jobs, cfg, parse_policy("multifactor"));
    EXPECT_DOUBLE_EQ(r.jobs[2].start, 100);
    EXPECT_DOUBLE_EQ(r.jobs[1].start, 200);
    // Age weighs more once PriorityMaxAge is short: max age 100 s, size 10:
    //   b: 1000 * 90/100 + 10 * 1/4 = 902.5
    //   c: 1000 * 80/100 + 10 * 4/4 = 810    -> b first, as FIFO.
    cfg.weight_size = 10, cfg.priority_max_age_s = 100;
    r = simulate(jobs, cfg, parse_policy("multifactor-fifo"));
    EXPECT_DOUBLE_EQ(r.jobs[1].start, 100);
    EXPECT_DOUBLE_EQ(r.jobs[2].start, 200);
    // ... and with max age 1 day size wins again: b 1.04 + 2.5, c 0.93 + 10.
    cfg.priority_max_age_s = 86400;
    r = simulate(jobs, cfg, parse_policy("multifactor-fifo"));
    EXPECT_DOUBLE_EQ(r.jobs[2].start, 100);
    // Max age 100 s again, but with Slurm's PriorityCalcPeriod of 5 min: the
    // last recalculation was at 0, so at 100 b and c keep the priorities
    // they got when queued, at ages 0: b 2.5, c 10 -> c first.
    cfg.priority_max_age_s = 100;
    cfg.priority_calc_period_s = 300;
    r = simulate(jobs, cfg, parse_policy("multifactor-fifo"));
    EXPECT_DOUBLE_EQ(r.jobs[2].start, 100);
    EXPECT_DOUBLE_EQ(r.jobs[1].start, 200);
}

TEST(SimPriority, FairShareAgainstFifo) {
    // 2 nodes; user x's a holds both 0..100. x's b arrives at 10, y's c at
    // 20 (2 nodes, 100 s each). FIFO: b at 100, c at 200.
    const std::vector<SimJob> jobs = {user_job("a", "x", 0, 2, 100), user_job("b", "x", 10, 2, 100),
                                      user_job("c", "y", 20, 2, 100)};
    SimConfig cfg = test::cluster(2, 1);
    SimResult r = simulate(jobs, cfg, parse_policy("fifo"));
    EXPECT_DOUBLE_EQ(r.jobs[1].start, 100);
    EXPECT_DOUBLE_EQ(r.jobs[2].start, 200);
    // Fair share only: at 100 all decayed usage is x's (U = 1), shares
    // 1/2 each: F(x) = 2^(-1/0.5) = 0.25, F(y) = 2^0 = 1 -> c first.
    cfg.weight_age = 0, cfg.weight_size = 0, cfg.weight_fairshare = 1000;
    cfg.priority_calc_period_s = 0;
    r = simulate(jobs, cfg, parse_policy("multifactor-fifo"));
    EXPECT_DOUBLE_EQ(r.jobs[2].start, 100);
    EXPECT_DOUBLE_EQ(r.jobs[1].start, 200);
    // x with 7 shares to y's 1: S(x) = 7/8, F(x) = 2^(-1/0.875) = 0.45 < 1:
    // still c first. Usage wins over shares until x's share is all of it.
    cfg.shares = {{"x", 7}, {"y", 1}};
    r = simulate(jobs, cfg, parse_policy("multifactor-fifo"));
    EXPECT_DOUBLE_EQ(r.jobs[2].start, 100);
    // Add age with PriorityMaxAge 100 s and weight 1000: b 1000*0.9 + 1000*0.45 = 1350,
    // c 1000*0.8 + 1000 = 1800 -> c; weight 5000: b 4500 + 450 = 4950, c 4000 + 1000
    // = 5000 -> still c; weight 10000: b 9450, c 9000 -> b first, as FIFO.
    cfg.priority_max_age_s = 100;
    cfg.weight_age = 10000;
    r = simulate(jobs, cfg, parse_policy("multifactor-fifo"));
    EXPECT_DOUBLE_EQ(r.jobs[1].start, 100);
    EXPECT_DOUBLE_EQ(r.jobs[2].start, 200);
}

TEST(SimPriority, SlurmConfPriorityKeys) {
    const SlurmConf c = parse_slurm_conf(
        "PriorityType=priority/multifactor\n"
        "PriorityWeightAge=1000\nPriorityWeightJobSize=200\nPriorityWeightFairshare=5000\n"
        "PriorityMaxAge=14-0\nPriorityDecayHalfLife=2-12\nPriorityCalcPeriod=2\n",
        "s.conf", false);
    EXPECT_EQ(c.priority_type, "priority/multifactor");
    EXPECT_DOUBLE_EQ(c.weight_age, 1000);
    EXPECT_DOUBLE_EQ(c.weight_size, 200);
    EXPECT_DOUBLE_EQ(c.weight_fairshare, 5000);
    EXPECT_DOUBLE_EQ(c.priority_max_age_s, 14 * 86400);
    EXPECT_DOUBLE_EQ(c.decay_half_life_s, 2.5 * 86400);
    EXPECT_DOUBLE_EQ(c.calc_period_s, 120);  // minutes, as Slurm reads it
    EXPECT_NE(error_of([] {
                  parse_slurm_conf("PriorityWeightAge=lots\n", "s.conf", false);
              }).find("s.conf:1: PriorityWeightAge=lots is not a whole number"),
              std::string::npos);
    EXPECT_NE(error_of([] {
                  parse_slurm_conf("\nPriorityMaxAge=soon\n", "s.conf", false);
              }).find("s.conf:2: PriorityMaxAge"),
              std::string::npos);
    EXPECT_NE(error_of([] {
                  parse_slurm_conf("PriorityType=priority/x\n", "s.conf", false);
              }).find("PriorityType=priority/x is not one the simulator models"),
              std::string::npos);
    EXPECT_NE(error_of([] {
                  parse_slurm_conf("PriorityWeightAge=1\n", "s.conf");
              }).find("no NodeName lines"),
              std::string::npos);
}

}  // namespace
}  // namespace apiary::sim

namespace apiary::sim {
namespace {

TEST(SimLimits, UserJobLimitHoldsOnlyThatUsersJobs) {
    // 4 nodes. x submits three 1-node jobs, then y one; x may run 2 at a time.
    // FIFO without limits: x1, x2, x3, y1 all start at 0. With the limit x3
    // waits for x1 (ends at 100) while y1, behind it in the queue, starts at once.
    const std::vector<SimJob> jobs = {
        user_job("x1", "x", 0, 1, 100), user_job("x2", "x", 0, 1, 100),
        user_job("x3", "x", 0, 1, 100), user_job("y1", "y", 1, 1, 100)};
    SimConfig cfg = test::cluster(4, 1);
    SimResult r = simulate(jobs, cfg, parse_policy("fifo"));
    EXPECT_DOUBLE_EQ(r.jobs[2].start, 0);
    cfg.limits = parse_limits("kind,name,max_running_jobs,max_nodes\nuser,x,2,\n", "l.csv");
    r = simulate(jobs, cfg, parse_policy("fifo"));
    EXPECT_DOUBLE_EQ(r.jobs[0].start, 0);
    EXPECT_DOUBLE_EQ(r.jobs[1].start, 0);
    EXPECT_DOUBLE_EQ(r.jobs[2].start, 100);
    EXPECT_DOUBLE_EQ(r.jobs[3].start, 1);
    // A node limit on every account ("*"): 1 node each, all in "default".
    cfg.limits = parse_limits("kind,name,max_running_jobs,max_nodes\naccount,*,,1\n", "l.csv");
    r = simulate(jobs, cfg, parse_policy("fifo"));
    EXPECT_DOUBLE_EQ(r.jobs[1].start, 100);
    EXPECT_DOUBLE_EQ(r.jobs[3].start, 300);
}

TEST(SimLimits, BadLimitsNameFileLineAndField) {
    auto err = [](const std::string& text) {
        return error_of([&] { parse_limits(text, "l.csv"); });
    };
    EXPECT_NE(err("user,max\n").find("l.csv:1: header 'user,max' is not"), std::string::npos);
    EXPECT_NE(err("kind,name,max_running_jobs,max_nodes\ngroup,a,1,1\n")
                  .find("l.csv:2: field 'kind': 'group' is not user or account"),
              std::string::npos);
    EXPECT_NE(err("kind,name,max_running_jobs,max_nodes\nuser,a,-1,1\n")
                  .find("l.csv:2: field 'max_running_jobs': '-1' is negative"),
              std::string::npos);
    EXPECT_NE(err("kind,name,max_running_jobs,max_nodes\nuser,a,1,1\nuser,a,2,\n")
                  .find("l.csv:3: user 'a' has a limit already"),
              std::string::npos);
    EXPECT_NE(
        err("kind,name,max_running_jobs,max_nodes\nuser,,1,1\n").find("l.csv:2: field 'name'"),
        std::string::npos);
}

}  // namespace
}  // namespace apiary::sim

namespace apiary::sim {
namespace {

TEST(SimBackfill, ReservationDepthProtectsTheSecondJob) {
    // 4 nodes. a (2 nodes) runs 0..100. b (3 nodes) arrives at 1 and
    // cannot start; c (4 nodes) at 2; d (1 node, 1000 s) at 3.
    // EASY reserves for b only (at 100, leaving 1 node spare): d fits in
    // that spare node and starts at 3, holding it to 1003, so c waits to 1003.
    // With two reservations (b at 100..200, c at 200..300) d would delay c:
    // it waits to 300, and c starts at 200.
    const std::vector<SimJob> jobs = {test::job("a", 0, 2, 100), test::job("b", 1, 3, 100),
                                      test::job("c", 2, 4, 100), test::job("d", 3, 1, 1000)};
    SimConfig cfg = test::cluster(4, 1);
    SimResult r = simulate(jobs, cfg, parse_policy("backfill"));
    EXPECT_DOUBLE_EQ(r.jobs[3].start, 3);
    EXPECT_DOUBLE_EQ(r.jobs[1].start, 100);
    EXPECT_DOUBLE_EQ(r.jobs[2].start, 1003);
    cfg.bf_max_job_test = 2;
    r = simulate(jobs, cfg, parse_policy("backfill"));
    EXPECT_DOUBLE_EQ(r.jobs[1].start, 100);
    EXPECT_DOUBLE_EQ(r.jobs[2].start, 200);
    EXPECT_DOUBLE_EQ(r.jobs[3].start, 300);
    EXPECT_DOUBLE_EQ(r.jobs[2].reservation, 200);
    // bf_window 150 s: at 3, c's earliest start (200) is 197 s ahead, so it
    // gets no reservation and d backfills as under EASY.
    cfg.bf_window_s = 150;
    r = simulate(jobs, cfg, parse_policy("backfill"));
    EXPECT_DOUBLE_EQ(r.jobs[3].start, 3);
    EXPECT_DOUBLE_EQ(r.jobs[2].start, 1003);
    // Multifactor with the same depth keeps the guarantee (size orders c
    // before b here: c at 100, then b and d together at 200).
    cfg.bf_window_s = 86400;
    cfg.weight_age = 0, cfg.weight_fairshare = 0, cfg.priority_calc_period_s = 0;
    r = simulate(jobs, cfg, parse_policy("multifactor"));
    EXPECT_DOUBLE_EQ(r.jobs[2].start, 100);
    EXPECT_DOUBLE_EQ(r.jobs[1].start, 200);
    EXPECT_DOUBLE_EQ(r.jobs[3].start, 200);
}

}  // namespace
}  // namespace apiary::sim

namespace apiary::sim {
namespace {

TEST(SimPriority, CobaltWfpAgainstBackfill) {
    // 4 nodes; a holds them 0..100. b (4 nodes, limit 1000 s) arrives at 10,
    // c (1 node, limit 10 s) at 50. EASY in submission order: b at 100 (to
    // 1100), c after it at 1100. WFP at 100 (recalculated every pass):
    //   b: (90 / 1000)^3 x 4 = 0.0029,  c: (50 / 10)^3 x 1 = 125  -> c first,
    // then b, which cannot fit beside it, at 110.
    const std::vector<SimJob> jobs = {test::job("a", 0, 4, 100), test::job("b", 10, 4, 1000, 1000),
                                      test::job("c", 50, 1, 10, 10)};
    SimConfig cfg = test::cluster(4, 1);
    SimResult r = simulate(jobs, cfg, parse_policy("backfill"));
    EXPECT_DOUBLE_EQ(r.jobs[1].start, 100);
    EXPECT_DOUBLE_EQ(r.jobs[2].start, 1100);
    cfg.priority_calc_period_s = 0;
    r = simulate(jobs, cfg, parse_policy("wfp"));
    EXPECT_DOUBLE_EQ(r.jobs[2].start, 100);
    EXPECT_DOUBLE_EQ(r.jobs[1].start, 110);
}

}  // namespace
}  // namespace apiary::sim
