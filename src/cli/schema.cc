// The one schema of every config key. Each layer contributes its own keys;
// trainer and planner read the same file.

#include "cli/command.h"
#include "plan/planner.h"
#include "train/keys.h"

namespace apiary::cli {

const core::Schema& full_schema() {
    static const core::Schema schema = [] {
        core::Schema s;
        core::add_shared_keys(s);
        train::add_keys(s);  // train.*, data.* (with the loader's), run.*, comm.*
        plan::add_keys(s);
        return s;
    }();
    return schema;
}

core::Config load_config(const std::string& config_file, const std::vector<std::string>& sets) {
    core::Config config(full_schema());
    if (!config_file.empty()) config.load_file(config_file);
    for (const auto& s : sets) config.set(s);
    return config;
}

}  // namespace apiary::cli
