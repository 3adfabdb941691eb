// Queueing theory the cluster simulator must reproduce: M/M/c waiting time
// (Erlang C) for Poisson arrivals and exponential jobs on c single-device
// nodes, over a long trace.

#include <gtest/gtest.h>

#include <cmath>

#include "core/rng.h"
#include "sim_test_util.h"

namespace apiary::sim {
namespace {

// Erlang C: probability that an arrival waits, for c servers at offered load a = lambda / mu.
double erlang_c(int c, double a) {
    double sum = 0, term = 1;
    for (int k = 0; k < c; ++k) {
        if (k > 0) term *= a / k;
        sum += term;
    }
    const double last = term * a / c;  // a^c / c!
    const double rho = a / c;
    return last / (1 - rho) / (sum + last / (1 - rho));
}

std::vector<SimJob> poisson_trace(int n, double lambda, double mu, uint64_t seed) {
    const core::Philox rng(seed, 0);
    std::vector<SimJob> jobs;
    double t = 0;
    for (int i = 0; i < n; ++i) {
        t += -std::log1p(-rng.uniform_f64(2 * uint64_t(i))) / lambda;
        const double s = -std::log1p(-rng.uniform_f64(2 * uint64_t(i) + 1)) / mu;
        jobs.push_back(test::job(std::to_string(i), t, 1, s));
    }
    return jobs;
}

TEST(SimQueueing, MMcWaitMatchesErlangC) {
    const int c = 4;
    const double mu = 1.0 / 100, lambda = 0.75 * c * mu;  // utilisation 0.75
    const auto jobs = poisson_trace(200000, lambda, mu, 7);
    SimConfig cfg = test::cluster(c, 1);
    cfg.record = false;
    const SimResult r = simulate(jobs, cfg, parse_policy("fifo"));
    double wait = 0, waited = 0;
    for (const auto& o : r.jobs) {
        ASSERT_EQ(o.state, JobState::completed);
        wait += o.start - o.eligible;
        waited += o.start > o.eligible;
    }
    wait /= double(jobs.size());
    waited /= double(jobs.size());
    const double p_wait = erlang_c(c, lambda / mu);
    const double expected = p_wait / (c * mu - lambda);
    EXPECT_NEAR(wait / expected, 1.0, 0.04) << "simulated " << wait << " s, Erlang C " << expected;
    EXPECT_NEAR(waited / p_wait, 1.0, 0.04) << "P(wait) " << waited << ", Erlang C " << p_wait;
    EXPECT_NEAR(r.busy_device_s / r.available_device_s, 0.75, 0.01);
}

}  // namespace
}  // namespace apiary::sim
