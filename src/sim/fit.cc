#include "sim/fit.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <limits>
#include <map>
#include <set>

#include "sim/capacity.h"
#include "sim/report.h"

namespace apiary::sim {

bool FitSetting::multifactor() const { return policy.rfind("multifactor", 0) == 0; }

std::string FitSetting::name() const {
    std::string n = "--policies " + policy;
    if (policy != "fifo" && policy != "multifactor-fifo") {
        n += fmt::format(" --bf-max-job-test {}", bf_max_job_test);
    }
    if (multifactor()) {
        n += fmt::format(" --priority-weights age={:g},size={:g},fairshare={:g}", weight_age,
                         weight_size, weight_fairshare);
        if (favor_small) n += " --priority-favor-small";
        n += fmt::format(" --priority-max-age-days {:g}", max_age_s / 86400);
    }
    if (user_max_jobs >= 0) n += fmt::format(" --user-max-jobs {}", user_max_jobs);
    if (implied_gap_h >= 0)
        n += fmt::format(" --capacity implied --implied-gap-hours {:g}", implied_gap_h);
    return n;
}

std::vector<FitSetting> fit_grid(const std::vector<std::string>& policies, bool implied,
                                 bool fairshare, bool user_limits) {
    std::vector<FitSetting> grid;
    std::vector<double> gaps = {-1};
    if (implied) gaps.push_back(2);
    std::vector<long long> limits = {-1};
    if (user_limits) limits.insert(limits.end(), {1, 2, 4});
    for (const auto& p : policies) {
        FitSetting s;
        s.policy = p;
        const bool blocks = p == "fifo" || p == "multifactor-fifo";
        const std::vector<int> depths = blocks ? std::vector<int>{1} : std::vector<int>{1, 10};
        for (long long lim : limits) {
            s.user_max_jobs = lim;
            for (double gap : gaps) {
                s.implied_gap_h = gap;
                for (int d : depths) {
                    s.bf_max_job_test = d;
                    if (!s.multifactor()) {
                        grid.push_back(s);
                        continue;
                    }
                    // Job size: favouring large jobs (Slurm's default), not at
                    // all, favouring small ones (PriorityFavorSmall=YES), each
                    // against age at PriorityMaxAge 1 and 7 days.
                    const std::vector<std::pair<double, bool>> sizes = {
                        {1000, false}, {0, false}, {1000, true}};
                    for (const auto& [w, small] : sizes) {
                        for (double age_days : {1.0, 7.0}) {
                            for (double fs : fairshare ? std::vector<double>{0, 1000}
                                                       : std::vector<double>{0}) {
                                s.weight_size = w;
                                s.favor_small = small;
                                s.max_age_s = age_days * 86400;
                                s.weight_fairshare = fs;
                                grid.push_back(s);
                            }
                        }
                    }
                }
            }
        }
    }
    return grid;
}

long long infer_users(Trace& trace, double window_s) {
    std::set<std::string> named;
    for (const auto& j : trace.jobs) {
        if (!j.user.empty()) named.insert(j.user);
    }
    if (named.size() > 1) return 0;
    std::vector<size_t> order(trace.jobs.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        return trace.jobs[a].submit < trace.jobs[b].submit;
    });
    struct Open {
        std::string user;
        double last = 0;
    };
    std::map<std::pair<long long, double>, Open> open;  // (size, time limit) -> campaign
    long long users = 0;
    for (size_t i : order) {
        JobSpec& j = trace.jobs[i];
        Open& o = open[{j.devices, j.time_limit}];
        if (o.user.empty() || j.submit - o.last > window_s) {
            o.user = "burst:" + j.id;
            ++users;
        }
        o.last = j.submit;
        j.user = o.user;
    }
    return users;
}

Policy apply_setting(const FitSetting& s, const Trace& trace, SimConfig& cfg) {
    Policy p = parse_policy(s.policy);
    cfg.bf_max_job_test = s.bf_max_job_test;
    if (s.multifactor()) {
        cfg.weight_age = s.weight_age;
        cfg.weight_size = s.weight_size;
        cfg.weight_fairshare = s.weight_fairshare;
        cfg.favor_small = s.favor_small;
        cfg.priority_max_age_s = s.max_age_s;
    }
    if (s.user_max_jobs >= 0) cfg.limits.user["*"].max_jobs = s.user_max_jobs;
    if (s.implied_gap_h >= 0) {
        auto steps = implied_capacity(trace, cfg.devices(), s.implied_gap_h * 3600);
        for (auto& st : steps) st.nodes = (st.nodes + cfg.per_node - 1) / cfg.per_node;
        cfg.capacity = std::move(steps);
    }
    return p;
}

WaitStats wait_stats(const std::vector<SimJob>& jobs, const SimResult& r,
                     const std::function<bool(size_t)>& take) {
    WaitStats w;
    std::vector<double> sim, rec;
    for (size_t j = 0; j < jobs.size(); ++j) {
        const auto& s = jobs[j].spec;
        const auto& o = r.jobs[j];
        if (s.recorded_start < 0 || o.start < 0 || !take(j)) continue;
        sim.push_back(o.start - s.submit);
        rec.push_back(s.recorded_start - s.submit);
    }
    w.n = (long long)sim.size();
    if (sim.empty()) return w;
    for (size_t i = 0; i < sim.size(); ++i) {
        w.mean += sim[i] / double(sim.size());
        w.rec_mean += rec[i] / double(rec.size());
    }
    w.p50 = percentile(sim, 0.5), w.rec_p50 = percentile(rec, 0.5);
    w.p90 = percentile(sim, 0.9), w.rec_p90 = percentile(rec, 0.9);
    w.spearman = spearman(sim, rec);
    return w;
}

double fit_score(const WaitStats& w) {
    if (w.n == 0) return std::numeric_limits<double>::infinity();
    // A wait of zero on either side: ratios taken against a 1-second floor.
    auto lr = [](double a, double b) {
        return std::abs(std::log(std::max(a, 1.0) / std::max(b, 1.0)));
    };
    return lr(w.mean, w.rec_mean) + lr(w.p90, w.rec_p90) + (1 - w.spearman);
}

std::vector<FitTry> fit_search(const Trace& trace, const std::vector<SimJob>& jobs,
                               const SimConfig& base, const std::vector<FitSetting>& grid,
                               double scored_from, size_t* best) {
    std::vector<FitTry> tried;
    *best = 0;
    for (const auto& s : grid) {
        SimConfig c = base;
        const Policy p = apply_setting(s, trace, c);
        const SimResult r = simulate(jobs, c, p);
        FitTry t{s,
                 wait_stats(jobs, r, [&](size_t j) { return jobs[j].spec.submit >= scored_from; }),
                 0};
        t.score = fit_score(t.waits);
        if (!tried.empty() && t.score < tried[*best].score) *best = tried.size();
        tried.push_back(std::move(t));
    }
    return tried;
}

std::string size_class(long long nodes) {
    if (nodes <= 1) return "1";
    if (nodes == 2) return "2";
    long long hi = 2;
    while (hi < nodes) hi *= 2;
    return fmt::format("{}-{}", hi / 2 + 1, hi);
}

std::string month_of(double epoch_s, bool has_epoch, double t_s) {
    if (!has_epoch) {
        const long long b = (long long)std::floor(t_s / (30 * 86400.0));
        return fmt::format("day {}-{}", b * 30, b * 30 + 29);
    }
    const std::time_t t = std::time_t(std::floor(epoch_s + t_s));
    std::tm tm{};
    gmtime_r(&t, &tm);
    return fmt::format("{:04d}-{:02d}", tm.tm_year + 1900, tm.tm_mon + 1);
}

}  // namespace apiary::sim
