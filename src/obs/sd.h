#pragma once
// Prometheus file-based service discovery: the targets of a job's ranks,
// written by `apiary launch` where deploy/prometheus.yml looks for them.

#include <string>
#include <vector>

namespace apiary::obs {

struct ScrapeTarget {
    std::string host;  // as Prometheus should reach it
    int port = 0;
    int rank = 0;
};

// [{"targets": ["host:port"], "labels": {"apiary_run": run, "apiary_rank": "r",
// "apiary_host": host}}, ...],
// written atomically (Prometheus may read it at any moment).
void write_sd_targets(const std::string& path, const std::string& run,
                      const std::vector<ScrapeTarget>& targets);

// Ranks placed on hosts as mpirun places them by slot: "node1:4,node2:4"
// puts ranks 0-3 on node1 and 4-7 on node2 (a host without a count has one
// slot); with no hosts, every rank is on `address` (0.0.0.0 / :: mean this
// machine, 127.0.0.1).
std::vector<ScrapeTarget> place_targets(int ranks, const std::string& hosts,
                                        const std::string& address, int port_base);

}  // namespace apiary::obs
