#pragma once
// What `apiary launch` tells Prometheus: before it starts the ranks of a
// `train` command, it writes their metrics endpoints as file-based service
// discovery targets (metrics.sd_file, or prometheus/<run>.json beside the
// run directory: runs/prometheus/x.json for runs/x), from the same config
// the ranks will read.

#include <functional>
#include <string>
#include <vector>

#include "core/config.h"

namespace apiary::train {

// Builds a config from defaults, an optional TOML file and --set overrides,
// with every layer's keys (cli::load_config): the launcher reads the same
// config the ranks will.
using ConfigLoader = std::function<core::Config(const std::string& config_file,
                                                const std::vector<std::string>& sets)>;

// args: the apiary command after `--` (e.g. train --config x.toml --set
// a=b). Returns the file written, or "" when the command is not a training
// run, its metrics are off, or its config does not load (the ranks will say
// why themselves).
std::string write_launch_targets(int ranks, const std::string& hosts,
                                 const std::vector<std::string>& args,
                                 const ConfigLoader& load_config);

}  // namespace apiary::train
