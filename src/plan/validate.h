#pragma once
// `apiary plan validate`: the planner against published training runs
// (tests/plan/validation.toml). Each run gives its config as key=value
// settings, its source, its split (fit: used to choose the few fitted
// constants; holdout: never), and the figures it published. Errors are
// reported per metric group (throughput, iteration time, memory) and split.

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/config.h"
#include "plan/planner.h"

namespace apiary::plan {

struct ValidationRun {
    std::string name, source, split;  // split: "fit" or "holdout"
    std::vector<std::string> sets;    // key=value, as --set
    // Published figures by metric: tokens_per_s_per_device, model_tflops,
    // hw_tflops, mfu, gpu_hours_per_1t_tokens (throughput group);
    // step_time_s (iteration time); memory_gib (memory).
    std::map<std::string, double> measured;
};

// Throws IoError / ConfigError naming the file, the run and the field.
std::vector<ValidationRun> read_validation(const std::string& path);
const char* metric_group(const std::string& metric);  // "throughput", "iteration time", "memory"

// Constants the fit chooses, by name: "gemm_eff:<device>", "fp8_eff:<device>",
// "impl_eff:<implementation>". Applied over the catalog's values.
using Constants = std::map<std::string, double>;

struct ValidationRow {
    std::string run, split, metric;
    double measured = 0, predicted = 0, rel_err = 0;  // predicted / measured - 1
};
struct ValidationReport {
    std::vector<ValidationRow> rows;
    // group -> split -> {median, p90} of |rel_err|, and the count.
    struct Stat {
        double median = 0, p90 = 0;
        int n = 0;
    };
    std::map<std::string, std::map<std::string, Stat>> stats;
    int runs = 0;
};

// Predicts every run; throws ConfigError naming the run when one cannot be
// described (every run of the set must be).
ValidationReport validate(const std::vector<ValidationRun>& runs, const core::Schema& schema,
                          const Constants& constants = {});

// Fits the constants on the fit split, one group at a time: each device's
// GEMM efficiency on its Megatron runs, then its fp8 efficiency, then each
// other implementation's efficiency. Returns the fitted values and the
// catalog's for comparison ("catalog:" + name).
Constants fit_constants(const std::vector<ValidationRun>& runs, const core::Schema& schema);

std::string validation_table(const ValidationReport& r);
nlohmann::json to_json(const ValidationReport& r);

}  // namespace apiary::plan
