#pragma once
// Calibration of the cluster simulator against a recorded log (`apiary sim
// fit`, docs/sim.md "Fitting a policy to a log"): a small, fixed grid of
// the policy's free parameters (the policy, its reservation depth, the
// multifactor weights and PriorityMaxAge, PriorityFavorSmall, the capacity
// the log implies) is simulated on the first part of the log, each setting
// scored by how close its waits come to the record's, and the best one is
// carried, unchanged, to the rest of the log, where waits are compared by
// job-size class and by month. Deterministic: the grid's order breaks ties.

#include <functional>
#include <string>
#include <vector>

#include "sim/cluster_sim.h"
#include "sim/trace.h"

namespace apiary::sim {

// One point of the search.
struct FitSetting {
    std::string policy = "backfill";  // fifo, backfill, multifactor, multifactor-fifo, wfp
    int bf_max_job_test = 1;
    // Multifactor only: PriorityWeightAge, PriorityWeightJobSize (with
    // PriorityFavorSmall), PriorityWeightFairshare, PriorityMaxAge.
    double weight_age = 1000, weight_size = 0, weight_fairshare = 0;
    bool favor_small = false;
    double max_age_s = 7 * 86400;
    // < 0: the capacity given (or the whole cluster); else --capacity
    // implied with this --implied-gap-hours.
    double implied_gap_h = -1;
    // >= 0: every user may run at most this many jobs at once (Slurm's
    // association MaxJobs for user "*"); < 0: the limits given.
    long long user_max_jobs = -1;

    bool multifactor() const;
    std::string name() const;  // the `apiary sim cluster` flags that reproduce it
};

// The grid for these base policies: each with reservation depths 1 and 10
// (fifo: none); multifactor with age weight 1000 and job-size weight 1000
// favouring large jobs, 0, or 1000 favouring small jobs, at two
// PriorityMaxAge (1 and 7 days), and
// fair share on or off when `fairshare` (the log names more than one user
// or account); each once with the capacity as given and, when `implied`
// (the log records starts and no capacity is given), with the capacity the
// log implies at gaps of 2 hours; and when `user_limits` (users, and no
// limits given), with no running-job limit per user and limits of 1, 2 and 4.
std::vector<FitSetting> fit_grid(const std::vector<std::string>& policies, bool implied,
                                 bool fairshare, bool user_limits = false);

// Users inferred from a log that names none (or one): submissions of the
// same size and time limit, each within `window_s` of the previous one,
// are one user's campaign, named "burst:<its first job's id>" (a log's
// ensembles, which per-user limits then hold back as a real user's would).
// Returns how many users were inferred; 0 (and the trace untouched) when the
// log names more than one user already.
long long infer_users(Trace& trace, double window_s);

// Applies a setting to a base configuration: the policy to simulate, and the
// config's depth, weights and (implied) capacity, inferred from `trace`.
Policy apply_setting(const FitSetting& s, const Trace& trace, SimConfig& cfg);

// Simulated against recorded waits of the jobs `take` selects (those with a
// recorded start that the simulation started).
struct WaitStats {
    long long n = 0;
    double mean = 0, p50 = 0, p90 = 0;
    double rec_mean = 0, rec_p50 = 0, rec_p90 = 0;
    double spearman = 0;  // job by job, ties ranked by their mean
};
WaitStats wait_stats(const std::vector<SimJob>& jobs, const SimResult& r,
                     const std::function<bool(size_t)>& take);
// 0 when the mean and p90 equal the record's and the ranks agree exactly:
// |ln(mean ratio)| + |ln(p90 ratio)| + (1 - Spearman). Empty stats score +inf.
double fit_score(const WaitStats& w);

// Each setting simulated on `jobs` (prepared from `trace`), scored on the
// waits of the jobs submitted from `scored_from`; in the grid's order.
// `best` gets the index of the lowest score (the first of equal ones).
struct FitTry {
    FitSetting setting;
    WaitStats waits;
    double score = 0;
};
std::vector<FitTry> fit_search(const Trace& trace, const std::vector<SimJob>& jobs,
                               const SimConfig& base, const std::vector<FitSetting>& grid,
                               double scored_from, size_t* best);

// The report's groups: "129-256" nodes (powers of two), and the calendar
// month (UTC) of the submission ("2023-11"; without an epoch, 30-day blocks
// "day 30-59").
std::string size_class(long long nodes);
std::string month_of(double epoch_s, bool has_epoch, double t_s);

}  // namespace apiary::sim
