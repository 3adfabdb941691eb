#pragma once
// What a simulation says, per policy and per job: waits (mean, p95),
// completion times, utilisation, device-hours, lost work, restarts, cost,
// energy and CO2; tables and JSON of them; and, for a replayed Slurm
// record, how the simulated starts and ends compare with what Slurm did.

#include <iosfwd>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "sim/cluster_sim.h"

namespace apiary::sim {

struct Summary {
    std::string policy;
    long long jobs = 0, completed = 0, timeouts = 0, rejected = 0, unfinished = 0;
    double mean_wait_s = 0, p50_wait_s = 0, p95_wait_s = 0, max_wait_s = 0;
    double mean_completion_s = 0, p95_completion_s = 0;  // end - submit
    double makespan_s = 0, utilisation = 0;
    double device_hours = 0, lost_device_hours = 0, overhead_device_hours = 0;
    // Idle device-hours on partly busy nodes (free, but only beside the jobs
    // running there), and their share of all idle device-hours.
    double fragmented_device_hours = 0, fragmented_idle_share = 0;
    // With leaf switches: runs that fit in one leaf, and those spread over more.
    long long leaf_fit_runs = 0, leaf_split_runs = 0;
    long long restarts = 0, preemptions = 0, failure_restarts = 0;
    int node_failures = 0, spot_reclaims = 0;
    double cost_usd = 0, energy_kwh = 0, idle_energy_kwh = 0, co2_kg = 0;
    long long events = 0;
    double wall_s = 0;
};
Summary summarize(const std::vector<SimJob>& jobs, const SimResult& r);
// Nearest-rank percentile of unsorted values (q in [0, 1]); 0 when empty.
double percentile(std::vector<double> v, double q);

// Seconds in the most readable unit: "45s", "12.5m", "3.2h", "2.1d".
std::string format_duration(double s);

nlohmann::json to_json(const Summary& s);
// Policies side by side, one row each.
std::string summary_table(const std::vector<Summary>& s);

// One row per job and policy: id, policy, state, submit, eligible, start,
// end, wait, run, completion (end - submit), restarts, preemptions, failures, device-hours, lost
// device-hours, cost, energy, CO2, the recorded start and end (Slurm
// records) and the rejection reason.
void write_jobs_csv(const std::vector<SimJob>& jobs, const std::vector<SimResult>& results,
                    std::ostream& out);
nlohmann::json jobs_json(const std::vector<SimJob>& jobs, const SimResult& r);
// The cluster over time: one row per change of busy, available or queued.
void write_series_csv(const std::vector<SimResult>& results, std::ostream& out);

// Simulated against recorded (Slurm) starts and ends, for jobs with both.
struct ReplayCheck {
    long long compared = 0;
    double max_start_err_s = 0, max_end_err_s = 0, mean_abs_start_err_s = 0;
    bool same_start_order = true, same_end_order = true;
    std::string first_difference;  // where the orders first differ, if they do
    // Waits of the jobs submitted at or after `from` (the rest warm the
    // queue up): simulated against recorded, and their Spearman rank
    // correlation job by job (ties ranked by their mean).
    double from = 0;
    long long waits_compared = 0;
    double mean_wait_s = 0, recorded_mean_wait_s = 0;
    double p90_wait_s = 0, recorded_p90_wait_s = 0;
    double spearman_wait = 0;
};
ReplayCheck check_replay(const std::vector<SimJob>& jobs, const SimResult& r, double from = 0);
// Spearman's rank correlation of two equally long series (0 when either is constant).
double spearman(const std::vector<double>& a, const std::vector<double>& b);
nlohmann::json to_json(const ReplayCheck& c);

}  // namespace apiary::sim
