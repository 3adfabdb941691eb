#pragma once
// `apiary plan search`: every layout of tp, pp, dp, ZeRO stage, micro-batch,
// recomputation, sequence parallelism and pipeline schedule for a fixed
// global batch, dropping what does not divide or fit (with the reason) and
// ranking the rest by step time or by cost.

#include <map>
#include <string>
#include <vector>

#include "plan/planner.h"

namespace apiary::plan {

struct SearchOptions {
    bool by_cost = false;
    int top = 10;
    // Also try 1/2, 1/4, ... of the devices (cost can favour fewer of them).
    bool vary_devices = false;
    std::vector<int> micro_batches{1, 2, 4, 8, 16};
    std::vector<int> virtual_stages{2, 4};
};

struct SearchResult {
    std::vector<Plan> best;  // ranked, fitting
    std::vector<long long> best_devices;
    long long candidates = 0, fitting = 0;
    std::map<std::string, long long> dropped;    // reason -> count
    std::map<std::string, std::string> example;  // reason -> one layout it hit
    double seconds = 0;
    // The least memory any candidate needed, for "fits nowhere" messages.
    double min_bytes = 0;
    Layout min_layout;
    Memory min_memory;
};

SearchResult search(const Workload& w, const Cluster& c, const SearchOptions& opt);

// A sentence for a model that fits no layout: what the leanest layout needs
// and about how many devices (or how much memory per device) would do.
std::string fits_nowhere(const Workload& w, const Cluster& c, const SearchResult& r);

}  // namespace apiary::plan
