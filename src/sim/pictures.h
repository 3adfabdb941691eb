#pragma once
// The simulator's pictures, written as SVG by hand: for a cluster
// simulation, each policy's Gantt chart of jobs on devices with its
// utilisation and queue length over time, then the policies' outcomes side
// by side; for a collective simulation, each job's time per placement
// against the planner's alpha-beta time.

#include <string>
#include <vector>

#include "sim/cluster_sim.h"
#include "sim/report.h"

namespace apiary::sim {

// Gantt charts are drawn for at most this many runs and devices; beyond,
// a heat map of busy devices per group of nodes.
inline constexpr size_t kMaxGanttRects = 20000;
inline constexpr long long kMaxGanttDevices = 1024;

std::string cluster_svg(const std::vector<SimResult>& results,
                        const std::vector<Summary>& summaries, const SimConfig& cfg,
                        const std::string& title);

// One bar group per job, one bar per placement, drawn relative to the
// planner's time; values in seconds.
struct CommBars {
    std::vector<std::string> jobs;              // "job 1: all-reduce 1 GiB on 64"
    std::vector<std::string> placements;        // packed, spread, topology
    std::vector<std::vector<double>> shared_s;  // [placement][job], all jobs at once
    std::vector<std::vector<double>> alone_s;   // [placement][job], alone on the fabric
    std::vector<double> planner_s;              // [job]
};
std::string comm_svg(const CommBars& bars, const std::string& title);

}  // namespace apiary::sim
