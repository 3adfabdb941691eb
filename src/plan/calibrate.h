#pragma once
// `apiary plan calibrate`: fit the device's compute and communication
// constants to apiary's own measured runs (run directories written by the
// trainer: config.toml + metrics.jsonl), so that local predictions match.

#include <functional>
#include <string>
#include <vector>

#include "core/config.h"
#include "plan/planner.h"

namespace apiary::plan {

struct Calibration {
    std::string device;
    double gemm_eff = 0;  // fitted values; 0 means "not fitted, keep the catalog's"
    double mem_eff = 0;
    double gemm_knee = 0;
    double intra_bw = 0;       // bytes/s per rank, the link between ranks of a node
    double intra_latency = 0;  // s
    int runs = 0;
    double rms_rel_err_before = 0, rms_rel_err_after = 0;
    // Fitted constants (by their file keys) that ended at the edge of their
    // search range: the runs do not measure them.
    std::vector<std::string> at_bound;
    struct Row {
        std::string dir, layout;
        long long world_size = 1;
        double measured_s = 0, before_s = 0, after_s = 0;
    };
    std::vector<Row> rows;
};

Calibration read_calibration(const std::string& path);  // throws IoError / ConfigError
void write_calibration(const Calibration& cal, const std::string& path);
// Throws ConfigError when the calibration is for another device.
void apply_calibration(const Calibration& cal, Cluster& c);

struct RunRecord {
    std::string dir;
    PlanInput in;
    double step_time_s = 0;  // median over the steps after warm-up
    long long world_size = 1;
    int steps = 0;
};
// Keys of config.toml that the schema does not know (the trainer's own) are
// skipped; `device` (if not empty) replaces cluster.device. The run is
// apiary's trainer's, so cluster.implementation is apiary whatever it says.
RunRecord read_run(const std::string& dir, const core::Schema& schema, const std::string& device);
// Median step time of metrics.jsonl lines with "step_time_s", skipping warm-up.
double median_step_time(const std::string& metrics_path, int* steps, long long* world_size);

Calibration calibrate(const std::vector<RunRecord>& runs);

// Runs the calibration did not see, predicted with the catalog's constants
// (before_s) and with the calibration's (after_s).
std::vector<Calibration::Row> predict(const Calibration& cal, const std::vector<RunRecord>& runs);
// Root mean square of after_s / measured_s - 1 (before_s with `before`).
double rms_rel_err(const std::vector<Calibration::Row>& rows, bool before = false);

// The x in [lo, hi] (lo > 0) that minimises f, by golden-section search in
// log space: the fits here have few parameters and smooth objectives.
double golden_log_min(double lo, double hi, const std::function<double(double)>& f);

}  // namespace apiary::plan
