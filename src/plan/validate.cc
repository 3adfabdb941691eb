#include "plan/validate.h"

#include <fmt/format.h>
#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <functional>

#include "core/error.h"
#include "plan/calibrate.h"

namespace apiary::plan {

namespace {

constexpr double kGiB = 1024.0 * 1024 * 1024;

const char* const kMetrics[] = {"tokens_per_s_per_device", "model_tflops", "hw_tflops", "mfu",
                                "gpu_hours_per_1t_tokens", "step_time_s",  "memory_gib"};

bool is_metric(const std::string& k) {
    return std::find(std::begin(kMetrics), std::end(kMetrics), k) != std::end(kMetrics);
}

std::string field_string(const toml::table& t, const char* key, const std::string& where) {
    const auto* v = t.get(key);
    if (!v || !v->is_string()) {
        throw ConfigError(fmt::format("{}: needs a string field '{}'", where, key));
    }
    return *v->value<std::string>();
}

ValidationRun parse_run(const toml::table& t, const std::string& where) {
    ValidationRun r;
    r.name = field_string(t, "name", where);
    const std::string at = fmt::format("{} ({})", where, r.name);
    r.source = field_string(t, "source", at);
    r.split = field_string(t, "split", at);
    if (r.split != "fit" && r.split != "holdout") {
        throw ConfigError(fmt::format("{}: split = '{}' (known: fit, holdout)", at, r.split));
    }
    for (const auto& [k, node] : t) {
        const std::string key(k.str());
        if (key == "name" || key == "source" || key == "split" || key == "note") continue;
        if (key == "set") {
            const auto* arr = node.as_array();
            if (!arr) throw ConfigError(fmt::format("{}: 'set' must be a list of key=value", at));
            for (const auto& e : *arr) {
                if (!e.is_string()) {
                    throw ConfigError(fmt::format("{}: 'set' entries must be strings", at));
                }
                r.sets.push_back(*e.value<std::string>());
            }
        } else if (is_metric(key)) {
            const auto v = node.value<double>();
            if (!v || !(*v > 0)) {
                throw ConfigError(fmt::format("{}: {} must be a positive number", at, key));
            }
            r.measured[key] = *v;
        } else {
            throw ConfigError(
                fmt::format("{}: unknown field '{}' (known: name, source, split, note, set, {})",
                            at, key, fmt::join(kMetrics, ", ")));
        }
    }
    if (r.measured.empty()) throw ConfigError(fmt::format("{}: no published figure", at));
    return r;
}

struct Resolved {
    const ValidationRun* run;
    PlanInput in;
};

std::vector<Resolved> resolve_all(const std::vector<ValidationRun>& runs,
                                  const core::Schema& schema) {
    std::vector<Resolved> v;
    for (const auto& r : runs) {
        core::Config cfg(schema);
        try {
            for (const auto& s : r.sets) cfg.set(s);
            v.push_back({&r, plan_input(cfg)});
        } catch (const ConfigError& e) {
            throw ConfigError(fmt::format("validation run '{}': {}", r.name, e.what()));
        }
    }
    return v;
}

void apply(const Constants& k, Cluster& c) {
    if (auto it = k.find("gemm_eff:" + c.dev.name); it != k.end()) c.dev.gemm_eff = it->second;
    if (auto it = k.find("fp8_eff:" + c.dev.name); it != k.end()) c.dev.fp8_eff = it->second;
    if (auto it = k.find(std::string("impl_eff:") + impl_name(c.impl)); it != k.end()) {
        c.impl_eff = it->second;
    }
    if (auto it = k.find("launch_s"); it != k.end()) c.launch_s = it->second;
    if (auto it = k.find("alloc_frac"); it != k.end() && c.alloc_frac > 0)
        c.alloc_frac = it->second;
}

double predict(const Plan& p, const std::string& metric) {
    const double devs = double(p.l.devices());
    const StepTime& st = p.st;
    if (metric == "tokens_per_s_per_device") return st.tokens_per_s / devs;
    if (metric == "model_tflops") return st.tflops_per_device;
    if (metric == "hw_tflops") return st.hw_flops / st.total / devs / 1e12;
    if (metric == "mfu") return st.mfu;
    if (metric == "gpu_hours_per_1t_tokens") return 1e12 / st.tokens_per_s * devs / 3600;
    if (metric == "step_time_s") return st.total;
    return p.mem.total() / kGiB;  // memory_gib
}

std::vector<ValidationRow> rows_of(const std::vector<Resolved>& rs, const Constants& k) {
    std::vector<ValidationRow> rows;
    for (const auto& r : rs) {
        Cluster c = r.in.c;
        apply(k, c);
        const Plan p = evaluate(r.in.w, r.in.l, c);
        for (const auto& [metric, measured] : r.run->measured) {
            const double pred = predict(p, metric);
            rows.push_back(
                {r.run->name, r.run->split, metric, measured, pred, pred / measured - 1});
        }
    }
    return rows;
}

double quantile(std::vector<double> v, double q) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    const double x = q * double(v.size() - 1);
    const size_t i = size_t(x);
    return i + 1 < v.size() ? v[i] + (x - double(i)) * (v[i + 1] - v[i]) : v[i];
}

}  // namespace

const char* metric_group(const std::string& metric) {
    if (metric == "step_time_s") return "iteration time";
    if (metric == "memory_gib") return "memory";
    return "throughput";
}

std::vector<ValidationRun> read_validation(const std::string& path) {
    toml::table t;
    try {
        t = toml::parse_file(path);
    } catch (const toml::parse_error& e) {
        throw IoError(fmt::format("{}:{}: {}", path, e.source().begin.line, e.description()));
    }
    const auto* arr = t["run"].as_array();
    if (!arr) throw ConfigError(fmt::format("{}: no [[run]] tables", path));
    std::vector<ValidationRun> runs;
    for (const auto& node : *arr) {
        const auto* tab = node.as_table();
        const std::string where =
            fmt::format("{}:{} run {}", path, node.source().begin.line, runs.size() + 1);
        if (!tab) throw ConfigError(fmt::format("{}: not a table", where));
        runs.push_back(parse_run(*tab, where));
    }
    return runs;
}

ValidationReport validate(const std::vector<ValidationRun>& runs, const core::Schema& schema,
                          const Constants& constants) {
    ValidationReport r;
    r.rows = rows_of(resolve_all(runs, schema), constants);
    r.runs = int(runs.size());
    std::map<std::string, std::map<std::string, std::vector<double>>> errs;
    for (const auto& row : r.rows) {
        errs[metric_group(row.metric)][row.split].push_back(std::fabs(row.rel_err));
    }
    for (const auto& [group, splits] : errs) {
        for (const auto& [split, v] : splits) {
            r.stats[group][split] = {quantile(v, 0.5), quantile(v, 0.9), int(v.size())};
        }
    }
    return r;
}

namespace {

// Fits one constant at a time over the fit runs it governs, minimising the
// sum of squared log errors of their throughput and iteration-time figures
// (or their memory figures).
struct Fitter {
    const std::vector<Resolved>& all;
    Constants& k;

    template <class Governs>
    void operator()(const std::string& name, double lo, double hi, Governs&& governs,
                    bool memory = false) {
        std::vector<Resolved> sel;
        for (const auto& r : all) {
            if (r.run->split == "fit" && governs(r)) sel.push_back(r);
        }
        if (sel.empty()) return;
        k[name] = golden_log_min(lo, hi, [&](double x) {
            k[name] = x;
            double f = 0;
            for (const auto& row : rows_of(sel, k)) {
                if ((std::string(metric_group(row.metric)) == "memory") == memory) {
                    f += std::pow(std::log1p(row.rel_err), 2);
                }
            }
            return f;
        });
    }

    bool any_fit(const std::function<bool(const Resolved&)>& f) const {
        return std::any_of(all.begin(), all.end(),
                           [&](const Resolved& r) { return r.run->split == "fit" && f(r); });
    }
    // A device without Megatron runs in the fit split (Gaudi 2) is fitted on
    // its runs of any stack, and those runs then stay out of the stacks' fits.
    bool has_megatron(const std::string& d) const {
        return any_fit([&](const Resolved& r) {
            return r.in.c.dev.name == d && r.in.c.impl == Impl::megatron;
        });
    }
    bool dense_on(const Resolved& r, const std::string& d, bool fp8) const {
        return r.in.c.dev.name == d && (r.in.c.impl == Impl::megatron || !has_megatron(d)) &&
               !r.in.w.model.moe() && (r.in.w.dtype == Dtype::fp8) == fp8;
    }
};

// Per device: gemm_eff on its dense 16-bit runs, fp8_eff on its fp8 ones. A
// device with only fp8 runs to fit on (B200, Gaudi 2) gets its one constant
// as gemm_eff with fp8_eff = 1: its fp8 GEMMs then reach the same fraction
// of the fp8 peak as its 16-bit ones of the 16-bit peak.
void fit_devices(Fitter& fit, Constants& k) {
    std::vector<std::string> devices;
    for (const auto& r : fit.all) {
        if (std::find(devices.begin(), devices.end(), r.in.c.dev.name) == devices.end()) {
            devices.push_back(r.in.c.dev.name);
        }
    }
    auto fits_on = [&](const std::string& d, bool fp8) {
        return fit.any_fit([&](const Resolved& r) { return fit.dense_on(r, d, fp8); });
    };
    for (const auto& d : devices) {
        k["catalog:gemm_eff:" + d] = device(d).gemm_eff;
        const bool bf16 = fits_on(d, false);
        if (!bf16 && fits_on(d, true)) k["fp8_eff:" + d] = 1.0;
        fit("gemm_eff:" + d, 0.2, 1.0,
            [&](const Resolved& r) { return fit.dense_on(r, d, !bf16); });
    }
    for (const auto& d : devices) {
        k["catalog:fp8_eff:" + d] = device(d).fp8_eff;
        if (!fits_on(d, false)) continue;  // folded into gemm_eff above
        fit("fp8_eff:" + d, 0.3, 1.2, [&](const Resolved& r) { return fit.dense_on(r, d, true); });
    }
}

}  // namespace

Constants fit_constants(const std::vector<ValidationRun>& runs, const core::Schema& schema) {
    const std::vector<Resolved> all = resolve_all(runs, schema);
    Constants k;
    Fitter fit{all, k};
    // Device constants on dense runs first; then the MoE runs' host constant,
    // the allocator's reserve and the other stacks' fractions, on their own.
    fit_devices(fit, k);
    Cluster c;
    c.dev = device("H100-SXM");
    apply_profile(c, Impl::megatron);
    k["catalog:launch_s"] = c.launch_s;
    fit("launch_s", 1e-6, 200e-6,
        [&](const Resolved& r) { return r.in.c.impl == Impl::megatron && r.in.w.model.moe(); });
    k["catalog:alloc_frac"] = c.alloc_frac;
    fit(
        "alloc_frac", 0.01, 2.0,
        [&](const Resolved& r) { return r.run->measured.count("memory_gib") > 0; }, true);
    for (Impl i : {Impl::megatron2019, Impl::deepspeed, Impl::fsdp}) {
        apply_profile(c, i);
        k[std::string("catalog:impl_eff:") + impl_name(i)] = c.impl_eff;
        fit(std::string("impl_eff:") + impl_name(i), 0.3, 1.2, [&](const Resolved& r) {
            return r.in.c.impl == i && fit.has_megatron(r.in.c.dev.name);
        });
    }
    return k;
}

std::string validation_table(const ValidationReport& r) {
    std::string s = fmt::format("{} published runs, {} figures\n\n", r.runs, r.rows.size());
    s += fmt::format("{:<16} {:<8} {:>4} {:>10} {:>10}\n", "metric group", "split", "n",
                     "median |e|", "p90 |e|");
    for (const auto& [group, splits] : r.stats) {
        for (const auto& [split, st] : splits) {
            s += fmt::format("{:<16} {:<8} {:>4} {:>9.1f}% {:>9.1f}%\n", group, split, st.n,
                             100 * st.median, 100 * st.p90);
        }
    }
    return s;
}

nlohmann::json to_json(const ValidationReport& r) {
    nlohmann::json j;
    j["runs"] = r.runs;
    for (const auto& [group, splits] : r.stats) {
        for (const auto& [split, st] : splits) {
            j["groups"][group][split] = {
                {"n", st.n}, {"median_abs_err", st.median}, {"p90_abs_err", st.p90}};
        }
    }
    for (const auto& row : r.rows) {
        j["rows"].push_back({{"run", row.run},
                             {"split", row.split},
                             {"metric", row.metric},
                             {"measured", row.measured},
                             {"predicted", row.predicted},
                             {"rel_err", row.rel_err}});
    }
    return j;
}

}  // namespace apiary::plan
