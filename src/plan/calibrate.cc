#include "plan/calibrate.h"

#include <fmt/format.h>
#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "core/timing.h"
#include "plan/step_time.h"

namespace apiary::plan {

Calibration read_calibration(const std::string& path) {
    toml::table t;
    try {
        t = toml::parse_file(path);
    } catch (const toml::parse_error& e) {
        throw IoError(fmt::format("plan.calibration: cannot read '{}': {}", path,
                                  std::string(e.description())));
    }
    const auto* c = t["calibration"].as_table();
    if (!c) {
        throw ConfigError(fmt::format(
            "plan.calibration {}: no [calibration] table; write it with `apiary plan calibrate`",
            path));
    }
    Calibration cal;
    cal.device = (*c)["device"].value_or(std::string());
    if (cal.device.empty()) {
        throw ConfigError(fmt::format("plan.calibration {}: calibration.device is missing", path));
    }
    cal.gemm_eff = (*c)["gemm_eff"].value_or(0.0);
    cal.mem_eff = (*c)["mem_eff"].value_or(0.0);
    cal.gemm_knee = (*c)["gemm_knee"].value_or(0.0);
    cal.intra_bw = (*c)["intra_bw_gbs"].value_or(0.0) * 1e9;
    cal.intra_latency = (*c)["intra_latency_us"].value_or(0.0) * 1e-6;
    cal.runs = int((*c)["runs"].value_or(int64_t(0)));
    cal.rms_rel_err_after = (*c)["rms_rel_err"].value_or(0.0);
    return cal;
}

void write_calibration(const Calibration& cal, const std::string& path) {
    std::ofstream out(path);
    if (!out) throw IoError(fmt::format("calibrate: cannot write '{}'", path));
    out << "# Written by `apiary plan calibrate`; read with --calibration or plan.calibration.\n";
    out << "[calibration]\n";
    out << "device = " << core::toml_quote(cal.device) << "\n";
    out << fmt::format("gemm_eff = {:.6g}\n", cal.gemm_eff);
    out << fmt::format("mem_eff = {:.6g}\n", cal.mem_eff);
    out << fmt::format("gemm_knee = {:.6g}\n", cal.gemm_knee);
    out << fmt::format("intra_bw_gbs = {:.6g}\n", cal.intra_bw / 1e9);
    out << fmt::format("intra_latency_us = {:.6g}\n", cal.intra_latency * 1e6);
    out << fmt::format("runs = {}\n", cal.runs);
    out << fmt::format("rms_rel_err_before = {:.6g}\n", cal.rms_rel_err_before);
    out << fmt::format("rms_rel_err = {:.6g}\n", cal.rms_rel_err_after);
    out << "# fitted values at the edge of their search range: not measurable in these runs\n";
    out << "at_bound = [";
    for (size_t i = 0; i < cal.at_bound.size(); ++i) {
        out << (i ? ", " : "") << core::toml_quote(cal.at_bound[i]);
    }
    out << "]\n\n";
    for (const auto& r : cal.rows) {
        out << "[[calibration.run]]\n";
        out << "dir = " << core::toml_quote(r.dir) << "\n";
        out << "layout = " << core::toml_quote(r.layout) << "\n";
        out << fmt::format("world_size = {}\nmeasured_s = {:.6g}\n", r.world_size, r.measured_s);
        out << fmt::format("predicted_before_s = {:.6g}\npredicted_s = {:.6g}\n\n", r.before_s,
                           r.after_s);
    }
    if (!out) throw IoError(fmt::format("calibrate: error writing '{}'", path));
}

void apply_calibration(const Calibration& cal, Cluster& c) {
    if (cal.device != c.dev.name) {
        throw ConfigError(fmt::format(
            "plan.calibration is for device '{}' but cluster.device is '{}': calibrate on "
            "runs of this device or drop the calibration",
            cal.device, c.dev.name));
    }
    if (cal.gemm_eff > 0) c.dev.gemm_eff = cal.gemm_eff;
    if (cal.mem_eff > 0) c.dev.mem_eff = cal.mem_eff;
    if (cal.gemm_knee > 0) c.dev.gemm_knee = cal.gemm_knee;
    // The fitted link is what MPI sustains: efficiency folded into bw.
    if (cal.intra_bw > 0) c.intra.bw = cal.intra_bw, c.intra.efficiency = 1;
    if (cal.intra_latency > 0) c.intra.latency = cal.intra_latency;
}

double median_step_time(const std::string& path, int* steps, long long* world_size) {
    std::ifstream in(path);
    if (!in) throw IoError(fmt::format("calibrate: cannot read '{}'", path));
    std::vector<double> times;
    std::string line;
    int n = 0;
    while (std::getline(in, line)) {
        ++n;
        if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
        nlohmann::json j;
        try {
            j = nlohmann::json::parse(line);
        } catch (const nlohmann::json::parse_error& e) {
            throw DataError(fmt::format("{}:{}: not a JSON object ({})", path, n, e.what()));
        }
        if (!j.is_object() || !j.contains("step_time_s")) continue;  // eval lines
        if (!j["step_time_s"].is_number() || j["step_time_s"].get<double>() <= 0) {
            throw DataError(fmt::format("{}:{}: step_time_s must be a positive number", path, n));
        }
        times.push_back(j["step_time_s"].get<double>());
        if (j.contains("world_size") && j["world_size"].is_number_integer()) {
            *world_size = j["world_size"].get<long long>();
        }
    }
    if (times.empty()) {
        throw DataError(
            fmt::format("{}: no step lines with step_time_s; is this a training "
                        "run's metrics.jsonl?",
                        path));
    }
    // The first steps pay for page faults, thread start-up and caches.
    const size_t skip = times.size() >= 3 ? std::max<size_t>(1, times.size() / 10) : 0;
    std::vector<double> rest(times.begin() + long(skip), times.end());
    *steps = int(rest.size());
    return core::median(std::move(rest));
}

namespace {

void set_from_toml(core::Config& cfg, const core::Schema& schema, const toml::table& t,
                   const std::string& prefix, const std::string& source) {
    for (const auto& [k, node] : t) {
        const std::string key =
            prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
        if (const auto* sub = node.as_table()) {
            set_from_toml(cfg, schema, *sub, key, source);
            continue;
        }
        const core::KeySpec* spec = schema.find(key);
        if (!spec) continue;  // a trainer key the planner does not use
        core::Value v;
        if (spec->type == core::ValueType::integer && node.is_integer()) {
            v = int64_t(*node.value<int64_t>());
        } else if (spec->type == core::ValueType::real &&
                   (node.is_floating_point() || node.is_integer())) {
            v = *node.value<double>();
        } else if (spec->type == core::ValueType::boolean && node.is_boolean()) {
            v = *node.value<bool>();
        } else if (spec->type == core::ValueType::string && node.is_string()) {
            v = *node.value<std::string>();
        } else {
            throw ConfigError(fmt::format("{}: {} has the wrong type", source, key));
        }
        cfg.set_value(key, v, source);
    }
}

// The vocabulary a run trained with when its config left model.vocab_size
// at 0 (the tokenizer's): one more than the largest id of its
// tokenizer.json (Hugging Face format: model.vocab and added_tokens); 0 if
// the run has none.
int64_t tokenizer_vocab(const std::string& path) {
    std::ifstream in(path);
    if (!in) return 0;
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(in);
    } catch (const nlohmann::json::parse_error& e) {
        throw DataError(fmt::format("calibrate: {} is not JSON ({})", path, e.what()));
    }
    int64_t top = -1;
    auto take = [&](const nlohmann::json& id) {
        if (id.is_number_integer()) top = std::max(top, id.get<int64_t>());
    };
    if (j.contains("model") && j["model"].contains("vocab") && j["model"]["vocab"].is_object()) {
        for (const auto& [tok, id] : j["model"]["vocab"].items()) take(id);
    }
    if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
        for (const auto& t : j["added_tokens"]) {
            if (t.is_object() && t.contains("id")) take(t["id"]);
        }
    }
    if (top < 0) {
        throw DataError(fmt::format(
            "calibrate: {} has no token ids (model.vocab, added_tokens); set model.vocab_size "
            "in the run's config.toml",
            path));
    }
    return top + 1;
}

}  // namespace

RunRecord read_run(const std::string& dir, const core::Schema& schema, const std::string& device) {
    namespace fs = std::filesystem;
    RunRecord r;
    r.dir = dir;
    const std::string cfg_path = (fs::path(dir) / "config.toml").string();
    if (!fs::exists(cfg_path)) {
        throw IoError(
            fmt::format("calibrate: {} has no config.toml; give run directories "
                        "written by `apiary train`",
                        dir));
    }
    core::Config cfg(schema);
    try {
        set_from_toml(cfg, schema, toml::parse_file(cfg_path), "", cfg_path);
    } catch (const toml::parse_error& e) {
        throw IoError(
            fmt::format("calibrate: cannot parse {}: {}", cfg_path, std::string(e.description())));
    }
    r.step_time_s =
        median_step_time((fs::path(dir) / "metrics.jsonl").string(), &r.steps, &r.world_size);
    if (!device.empty()) cfg.set_value("cluster.device", device, "--device");
    cfg.set_value("cluster.gpus", int64_t(r.world_size), "metrics.jsonl world_size");
    if (cfg.get_int("model.vocab_size") == 0) {
        const std::string tok = (fs::path(dir) / "tokenizer.json").string();
        if (const int64_t v = tokenizer_vocab(tok); v > 0) {
            cfg.set_value("model.vocab_size", v, tok);
        }
    }
    cfg.set_value("plan.calibration", std::string(), "calibrate");
    cfg.set_value("cluster.implementation", std::string("apiary"), "a run of apiary's trainer");
    r.in = plan_input(cfg);
    return r;
}

namespace {

struct Param {
    const char* name;
    double lo, hi;  // bounds, searched in log space
    double* value;
};

double objective(const std::vector<RunRecord>& runs, const Calibration& cal,
                 std::vector<double>* preds) {
    double sum = 0;
    for (size_t i = 0; i < runs.size(); ++i) {
        Cluster c = runs[i].in.c;
        apply_calibration(cal, c);
        const double pred = step_time(runs[i].in.w, runs[i].in.l, c).total;
        if (preds) (*preds)[i] = pred;
        const double e = std::log(pred / runs[i].step_time_s);
        sum += e * e;
    }
    return sum;
}

}  // namespace

Calibration calibrate(const std::vector<RunRecord>& runs) {
    if (runs.empty()) throw ConfigError("calibrate: give at least one run directory");
    Calibration cal;
    cal.device = runs[0].in.c.dev.name;
    for (const auto& r : runs) {
        if (r.in.c.dev.name != cal.device) {
            throw ConfigError(
                fmt::format("calibrate: {} ran on '{}' but {} on '{}': calibrate "
                            "one device at a time (or pass --device)",
                            runs[0].dir, cal.device, r.dir, r.in.c.dev.name));
        }
    }
    cal.runs = int(runs.size());
    std::vector<double> before(runs.size()), after(runs.size());
    objective(runs, cal, &before);  // catalog constants: nothing applied yet

    // What the runs can pin down: compute always; memory-bound work with
    // three or more runs; the link between ranks with multi-rank runs, its
    // latency only with two or more distinct multi-rank shapes.
    const Cluster& c0 = runs[0].in.c;
    cal.gemm_eff = c0.dev.gemm_eff;
    std::vector<Param> params{{"gemm_eff", 1e-3, 4.0, &cal.gemm_eff}};
    if (runs.size() >= 3) {
        cal.mem_eff = c0.dev.mem_eff;
        params.push_back({"mem_eff", 1e-3, 16.0, &cal.mem_eff});
    }
    std::set<std::string> shapes;
    for (const auto& r : runs) {
        shapes.insert(fmt::format("{} {} {} {}", r.in.w.model.n_embd, r.in.w.seq_len,
                                  r.in.l.micro_batch, r.in.l.devices()));
    }
    if (shapes.size() >= 4) {  // matrix sizes vary enough to see the knee
        cal.gemm_knee = c0.dev.gemm_knee;
        params.push_back({"gemm_knee", 1.0, 4096.0, &cal.gemm_knee});
    }
    std::set<std::string> multi;
    for (const auto& r : runs) {
        if (r.in.l.devices() > 1) multi.insert(layout_string(r.in.l));
    }
    if (!multi.empty()) {
        cal.intra_bw = c0.intra.bw * c0.intra.efficiency;
        params.push_back({"intra_bw_gbs", 1e7, 1e12, &cal.intra_bw});
    }
    if (multi.size() >= 2) {
        cal.intra_latency = c0.intra.latency;
        params.push_back({"intra_latency_us", 1e-8, 1e-1, &cal.intra_latency});
    }
    // Coordinate descent, golden-section search in log space per parameter:
    // few parameters, a smooth objective, and no library worth a dependency.
    for (int sweep = 0; sweep < 6; ++sweep) {
        for (auto& p : params) {
            *p.value = golden_log_min(p.lo, p.hi, [&](double x) {
                *p.value = x;
                return objective(runs, cal, nullptr);
            });
        }
    }
    // A value at the edge of its range is not measured: the runs would have
    // it further out (a link too fast to show, a cost lost in the noise).
    for (const auto& p : params) {
        if (std::abs(std::log(*p.value / p.lo)) < 0.01 ||
            std::abs(std::log(p.hi / *p.value)) < 0.01) {
            cal.at_bound.push_back(p.name);
        }
    }
    objective(runs, cal, &after);
    for (size_t i = 0; i < runs.size(); ++i) {
        cal.rows.push_back({runs[i].dir, layout_string(runs[i].in.l), runs[i].world_size,
                            runs[i].step_time_s, before[i], after[i]});
    }
    cal.rms_rel_err_before = rms_rel_err(cal.rows, true);
    cal.rms_rel_err_after = rms_rel_err(cal.rows);
    return cal;
}

std::vector<Calibration::Row> predict(const Calibration& cal, const std::vector<RunRecord>& runs) {
    std::vector<Calibration::Row> rows;
    for (const auto& r : runs) {
        Cluster c = r.in.c;
        const double before = step_time(r.in.w, r.in.l, c).total;
        apply_calibration(cal, c);
        rows.push_back({r.dir, layout_string(r.in.l), r.world_size, r.step_time_s, before,
                        step_time(r.in.w, r.in.l, c).total});
    }
    return rows;
}

double rms_rel_err(const std::vector<Calibration::Row>& rows, bool before) {
    if (rows.empty()) return 0;
    double s = 0;
    for (const auto& r : rows) {
        const double e = (before ? r.before_s : r.after_s) / r.measured_s - 1;
        s += e * e;
    }
    return std::sqrt(s / double(rows.size()));
}

double golden_log_min(double lo, double hi, const std::function<double(double)>& f) {
    const double g = (std::sqrt(5.0) - 1) / 2;
    double a = std::log(lo), b = std::log(hi);
    auto fx = [&](double x) { return f(std::exp(x)); };
    double x1 = b - g * (b - a), x2 = a + g * (b - a);
    double f1 = fx(x1), f2 = fx(x2);
    for (int it = 0; it < 60; ++it) {
        if (f1 < f2) {
            b = x2, x2 = x1, f2 = f1, x1 = b - g * (b - a), f1 = fx(x1);
        } else {
            a = x1, x1 = x2, f1 = f2, x2 = a + g * (b - a), f2 = fx(x2);
        }
    }
    return std::exp(0.5 * (a + b));
}

}  // namespace apiary::plan
