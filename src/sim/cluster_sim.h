#pragma once
// A discrete-event simulator of a cluster running a job trace. Nodes of the
// catalog's devices (an on-demand pool and, with a spot profile, a spot
// pool), jobs allocated all-or-nothing (gang), a scheduling policy, node
// failures at a configured MTBF, spot capacity and price that change over
// time, checkpoints and restarts costed by the planner, and energy, cost
// and CO2 integrated over each run. Events only: arrivals, ends, releases,
// failures, repairs and profile steps; nothing ticks. docs/sim.md.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "sim/capacity.h"
#include "sim/job_model.h"
#include "sim/profile.h"
#include "sim/trace.h"

namespace apiary::sim {

// The order in which queued jobs are considered.
enum class Order {
    submit,     // first come, first served
    priority,   // priority class (higher first), then submit
    fairshare,  // priority class, then the account with the least decayed usage per share
    // Slurm's priority/multifactor: the weighted sum of age, job size and
    // fair-share factors, highest first (docs/sim.md "Multifactor priority").
    multifactor,
};

// Running-job and node limits of a user or account (Slurm's association
// MaxJobs and MaxTRES=node / GrpTRES=node); < 0: none.
struct Limit {
    long long max_jobs = -1, max_nodes = -1;
};
struct Limits {
    std::map<std::string, Limit> user, account;  // "*": everyone without their own line
    bool empty() const { return user.empty() && account.empty(); }
};
// CSV kind,name,max_running_jobs,max_nodes (kind user or account; name "*"
// for everyone else; an empty cell: no limit). Errors name file, line, field.
Limits parse_limits(const std::string& text, const std::string& source);
Limits read_limits(const std::string& path);

struct Policy {
    std::string name;
    Order order = Order::submit;
    // EASY backfill (Lifka 1995): when a job cannot start, it gets a
    // reservation at the earliest time enough devices free up (by the
    // running jobs' estimates); later jobs may start now if they end before
    // it or fit in the devices it leaves spare. Without: strict order, the
    // first job that does not fit blocks its pool.
    bool backfill = false;
    // A job that cannot start may stop running jobs of lower classes (they
    // lose their work since the last checkpoint, pay the restart and requeue).
    bool preempt = false;
    // Flexible jobs are held until the start time in [submit, deadline - run]
    // that minimises their CO2 under the carbon profile.
    bool carbon = false;
    // With Order::multifactor: rank by Cobalt's WFP utility instead, (time
    // queued / requested time)^3 x nodes (ALCF's scheduler on Theta).
    bool wfp = false;
};
// fifo, backfill, priority, twolevel, multifactor (with backfill, as Slurm's
// sched/backfill), multifactor-fifo (without) and wfp (Cobalt's utility,
// with backfill); each may take +preempt and +carbon,
// e.g. "twolevel+preempt". Throws ConfigError listing the known names.
Policy parse_policy(const std::string& name);

struct SimConfig {
    int nodes = 1;           // on-demand nodes
    int per_node = 1;        // devices per node
    int spot_nodes_max = 0;  // the spot pool's size (the profile's peak)
    Profile spot_nodes;      // spot nodes offered over time (empty: no spot pool)
    Profile spot_price;      // USD per device-hour over time (empty: spot_price_hour)
    double price_hour = 0;   // USD per device-hour on demand
    double spot_price_hour = 0;
    Profile carbon;                 // gCO2e per kWh over time
    double idle_kw_per_device = 0;  // an idle device at the wall
    double restart_s = 0;           // after an interruption, before work resumes
    // The scheduler reacts this long after a job arrives or ends: a job is
    // first considered `latency_s` after its submission, and devices come back
    // `latency_s` after a run ends (Slurm's controller ticks and job epilogs:
    // about 1 s). In between they are neither busy (utilisation, device-hours
    // and energy count only the jobs' runs) nor free.
    double latency_s = 0;
    double mtbf_node_s = 0;      // 0: nodes never fail
    double repair_s = 4 * 3600;  // a failed node is back after this
    int queue_depth = 1000;      // queued jobs looked at per scheduling pass
    // Backfill: how many jobs that cannot start get a reservation (1: EASY;
    // more: Slurm's sched/backfill, every job it tests; +preempt stays EASY),
    // and how far ahead (bf_window).
    int bf_max_job_test = 1;
    double bf_window_s = 86400;
    // SchedulerParameters bf_max_job_user: backfill tests at most this many
    // jobs of one user per pass (0: no limit); jobs started in order by the
    // main scheduler do not count.
    int bf_max_job_user = 0;
    // Nodes under one leaf switch (consecutive node ids; 0: no topology): a
    // job of whole nodes is placed inside one leaf when one has room.
    int nodes_per_leaf = 0;
    double fairshare_half_life_s = 7 * 86400;  // 0: usage never decays (PriorityDecayHalfLife)
    // Multifactor priority: PriorityWeightAge, PriorityWeightJobSize,
    // PriorityWeightFairshare, and PriorityMaxAge (the age factor is 1 from there).
    double weight_age = 1000, weight_size = 1000, weight_fairshare = 1000;
    double priority_max_age_s = 7 * 86400;
    // PriorityFavorSmall=YES: the job-size factor is 1 - the job's share of
    // the cluster (smaller jobs higher) instead of the share.
    bool favor_small = false;
    // PriorityCalcPeriod: queued jobs' priorities are recomputed this often;
    // a job queued in between is ranked by its priority when queued.
    double priority_calc_period_s = 300;
    std::map<std::string, double> shares;  // account -> share (default 1)
    uint64_t seed = 1;                     // failure times
    bool record = true;                    // keep run segments and the series (pictures)
    double horizon_s = kNever;             // stop here; what has not finished is "unfinished"
    Limits limits;  // a job over its user's or account's limit waits; others pass it
    // On-demand nodes available over time (empty: all `nodes`, always).
    std::vector<CapacityStep> capacity;

    long long devices() const { return (long long)nodes * per_node; }
};

// A trace job with the planner's view of it.
struct SimJob {
    JobSpec spec;
    JobCost cost;
    std::string reject;  // it can never run on this cluster, and why
};
// Costs every job and rejects, with a reason, those that can never run:
// larger than their pool, out of memory, a layout the planner refuses, a
// Slurm record with nothing to replay.
std::vector<SimJob> prepare_jobs(const Trace& trace, JobModel& model, const SimConfig& cfg);

enum class JobState { rejected, completed, timeout, unfinished };
const char* job_state_name(JobState s);

struct JobOutcome {
    JobState state = JobState::unfinished;
    double eligible = 0;  // when it could first start (after a carbon hold)
    double start = -1;    // first start
    double end = -1;      // completion (or time-out)
    int restarts = 0, preemptions = 0, failures = 0;
    double device_s = 0;           // devices x time allocated
    double lost_device_s = 0;      // work since the last checkpoint, thrown away
    double overhead_device_s = 0;  // restarts and checkpoint writes
    double cost_usd = 0, energy_kwh = 0, co2_g = 0;
    double reservation = -1;  // first backfill reservation it got (-1: none)
};

struct Segment {  // one run of a job on its devices
    int job = 0;
    double start = 0, end = 0;
    uint32_t slot_begin = 0, slot_count = 0;  // into SimResult::slots
};

struct SeriesPoint {  // the cluster from time t until the next point
    double t = 0;
    long long busy = 0;       // devices allocated
    long long available = 0;  // devices up and offered (spot included)
    long long queued = 0;     // jobs waiting
};

struct SimResult {
    std::string policy;
    std::vector<JobOutcome> jobs;  // parallel to the prepared jobs
    std::vector<Segment> segments;
    std::vector<int32_t> slots;
    std::vector<SeriesPoint> series;
    long long events = 0;
    double wall_s = 0;  // simulator run time
    double makespan = 0;
    double busy_device_s = 0, available_device_s = 0;
    double fragmented_device_s = 0;  // free devices on partly busy nodes, over time
    double idle_energy_kwh = 0, idle_co2_g = 0;
    int node_failures = 0, spot_reclaims = 0;
    // With leaves: runs of at most a leaf's nodes, and how many of those
    // were spread over more than one leaf.
    long long leaf_fit_runs = 0, leaf_split_runs = 0;
};

SimResult simulate(const std::vector<SimJob>& jobs, const SimConfig& cfg, const Policy& policy);

// Interrupting a run `elapsed` seconds after it started: the restart
// overhead comes first, then work in intervals of `interval` seconds each
// followed by a checkpoint of `ckpt` seconds (interval <= 0: checkpoints
// are free and continuous). Returns the work saved by the last completed
// checkpoint and the work (and partial checkpoint) thrown away.
struct Progress {
    double saved = 0, lost = 0;
};
Progress progress_at(double elapsed, double restart, double work_left, double interval,
                     double ckpt);
// Wall time of a run that finishes `work_left` (restart + work + checkpoints).
double run_duration(double restart, double work_left, double interval, double ckpt);

}  // namespace apiary::sim
