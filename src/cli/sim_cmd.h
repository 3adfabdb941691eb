#pragma once
// `apiary sim`: its subcommands live in sim_*_cmd.cc; this is what they share.

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "core/config.h"

namespace apiary::cli {

// The cluster options of `apiary plan`: --config, --cluster, --set, --gpus.
struct SimClusterOptions {
    std::string config_file, cluster_file, gpus;
    std::vector<std::string> sets;
};
void add_sim_cluster_options(CLI::App* cmd, SimClusterOptions& o);
core::Config resolve_sim_config(const SimClusterOptions& o);

// Writes text to `path` whole or not at all (temporary name, then rename).
void write_file_atomically(const std::string& path, const std::string& text, const char* what);

void add_sim_cluster(CLI::App* sim);  // sim_cluster_cmd.cc
void add_sim_comm(CLI::App* sim);     // sim_comm_cmd.cc
void add_sim_fit(CLI::App* sim);      // sim_cluster_cmd.cc

}  // namespace apiary::cli
