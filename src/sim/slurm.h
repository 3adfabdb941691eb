#pragma once
// What the simulator reads of a Slurm installation: its time formats and
// the scheduling part of slurm.conf (scheduler type, nodes and their CPUs /
// GPUs), so a replay runs under the policy and cluster Slurm had.

#include <string>
#include <vector>

namespace apiary::sim {

// "2026-12-03T04:49:46" -> Unix seconds, read as UTC (only differences matter).
// Throws DataError naming `where` when malformed.
double parse_slurm_time(const std::string& text, const std::string& where);
// Slurm durations: "MM", "MM:SS", "HH:MM:SS", "D-HH", "D-HH:MM", "D-HH:MM:SS"
// (a bare number is minutes, as in `sbatch -t`); UNLIMITED, Partition_Limit
// -> kNever.
double parse_slurm_duration(const std::string& text, const std::string& where);
// Host names in a Slurm hostlist: "vm" -> 1, "node[01-16]" -> 16, "a[1-3,5],b" -> 5.
long long hostlist_count(const std::string& hostlist, const std::string& where);

struct SlurmConf {
    std::string scheduler = "sched/backfill";  // SchedulerType (Slurm's default)
    long long nodes = 0;
    long long cpus_per_node = 0;    // of the first NodeName line
    long long gpus_per_node = 0;    // Gres=gpu:N
    long long bf_max_job_test = 0;  // 0: not set
    long long bf_max_job_user = 0;  // 0: not set
    double bf_window_s = -1;        // SchedulerParameters bf_window (minutes there); < 0: not set
    // Multifactor priority (< 0: not set, the simulator's default applies).
    std::string priority_type = "priority/basic";  // PriorityType (Slurm's default)
    double weight_age = -1, weight_size = -1, weight_fairshare = -1;  // PriorityWeight*
    double priority_max_age_s = -1;                                   // PriorityMaxAge
    double decay_half_life_s = -1;                                    // PriorityDecayHalfLife
    double calc_period_s = -1;                                        // PriorityCalcPeriod
    int favor_small = -1;  // PriorityFavorSmall: 1 YES, 0 NO, -1 not set
    std::vector<std::string> notes;
};
// need_nodes: a file without NodeName lines is an error (the cluster's size
// comes from it); false when only its scheduling keys are wanted.
SlurmConf read_slurm_conf(const std::string& path, bool need_nodes = true);
SlurmConf parse_slurm_conf(const std::string& text, const std::string& source,
                           bool need_nodes = true);

}  // namespace apiary::sim
