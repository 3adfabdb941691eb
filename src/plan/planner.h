#pragma once
// The planner's entry points: its config keys, the Workload / Layout /
// Cluster a config describes, one evaluated plan and its reports.

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/config.h"
#include "plan/types.h"

namespace apiary::plan {

// cluster.* and plan.* keys (called from cli/schema.cc).
void add_keys(core::Schema& schema);

struct PlanInput {
    Workload w;
    Layout l;
    Cluster c;
    std::vector<std::string> warnings;  // keys set that the planner ignores
};
// Resolves the config into a plan input. Throws ConfigError naming the key
// when a layout does not divide (devices, heads, layers, global batch).
PlanInput plan_input(const core::Config& config);
// The same without layout checks: the device count, model and global batch
// for `plan search`, which varies the layout itself.
PlanInput search_input(const core::Config& config);
PlanInput resolve_input(const core::Config& config, bool check_layout);
// What an implementation profile sets (cluster.implementation).
void apply_profile(Cluster& c, Impl impl);
// The cluster alone (device, links, topology, prices, power, calibration).
Cluster cluster_from(const core::Config& config, long long devices);
// Checks that a layout divides the model and batch; "" when it does, else why.
std::string layout_problem(const Workload& w, const Layout& l);

struct Plan {
    Workload w;
    Layout l;
    Memory mem;
    StepTime st;
    Totals tot;
    bool fits = false;
    std::string why;                    // when it does not fit
    std::vector<std::string> warnings;  // what the user should know (table and JSON)
};
Plan evaluate(const Workload& w, const Layout& l, const Cluster& c);

std::string layout_string(const Layout& l);
nlohmann::json to_json(const Plan& p, const Cluster& c);
std::string to_table(const Plan& p, const Cluster& c);

}  // namespace apiary::plan
