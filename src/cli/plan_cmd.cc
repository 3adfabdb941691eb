// `apiary plan`: predict memory, step time, MFU, time-to-train, cost, energy
// and CO2e for a model on a cluster; `plan search` finds the best layout;
// `plan calibrate` fits the device constants to measured runs; `plan devices`
// lists the catalog. Formulas: docs/planner.md.

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "cli/command.h"
#include "core/error.h"
#include "plan/calibrate.h"
#include "plan/catalog.h"
#include "plan/planner.h"
#include "plan/search.h"
#include "plan/validate.h"

namespace apiary::cli {

namespace {

struct Options {
    std::string config_file, cluster_file;
    std::vector<std::string> sets;
    std::string model, gpus, calibration;
    // Kept as typed and passed on as --set would pass them, so that the
    // same values are refused with the same message.
    std::string tokens, global_batch;
    bool json = false;
};

void add_common(CLI::App* cmd, Options& o) {
    cmd->add_option("--config", o.config_file, "TOML config (the one `apiary train` reads)");
    cmd->add_option("--cluster", o.cluster_file,
                    "TOML file with a [cluster] table, read after --config");
    cmd->add_option("--set", o.sets, "key=value override (repeatable)");
    cmd->add_option("--model", o.model, "model preset (model.preset)");
    cmd->add_option("--gpus", o.gpus,
                    "devices, e.g. 1024xA100-80GB (cluster.gpus, cluster.device)");
    cmd->add_option("--tokens", o.tokens, "tokens to train on (plan.tokens), e.g. 300e9");
    cmd->add_option("--global-batch", o.global_batch,
                    "sequences per optimizer step (plan.global_batch; default "
                    "train.batch_size * train.grad_accum * dp)");
    cmd->add_option("--calibration", o.calibration, "file from `apiary plan calibrate`");
    cmd->add_flag("--json", o.json, "print one JSON object");
}

core::Config resolve(const Options& o) {
    // Command-line shorthands sit between the file and explicit --set.
    std::vector<std::string> sets;
    if (!o.model.empty()) sets.push_back("model.preset=" + o.model);
    if (!o.gpus.empty()) {
        const plan::GpuSpec g = plan::parse_gpus(o.gpus);
        if (g.count > 0) sets.push_back(fmt::format("cluster.gpus={}", g.count));
        if (!g.device.empty()) sets.push_back("cluster.device=" + g.device);
    }
    // Flag -> its --set form, for messages that name the flag the user typed.
    std::vector<std::pair<std::string, std::string>> flags;
    if (!o.tokens.empty()) flags.emplace_back("plan.tokens=" + o.tokens, "--tokens " + o.tokens);
    if (!o.global_batch.empty()) {
        flags.emplace_back("plan.global_batch=" + o.global_batch,
                           "--global-batch " + o.global_batch);
    }
    for (const auto& [assignment, flag] : flags) sets.push_back(assignment);
    if (!o.calibration.empty()) sets.push_back("plan.calibration=" + o.calibration);
    sets.insert(sets.end(), o.sets.begin(), o.sets.end());
    core::Config cfg = load_config(o.config_file, {});
    if (!o.cluster_file.empty()) cfg.load_file(o.cluster_file);
    for (const auto& s : sets) {
        try {
            cfg.set(s);
        } catch (const ConfigError& e) {
            for (const auto& [assignment, flag] : flags) {
                const std::string as_set = "--set " + assignment;
                const std::string what = e.what();
                if (assignment == s && what.rfind(as_set, 0) == 0) {
                    throw ConfigError(flag + what.substr(as_set.size()));
                }
            }
            throw;
        }
    }
    return cfg;
}

void run_plan(const Options& o) {
    const core::Config cfg = resolve(o);
    const plan::PlanInput in = plan::plan_input(cfg);
    plan::Plan p = plan::evaluate(in.w, in.l, in.c);
    p.warnings.insert(p.warnings.begin(), in.warnings.begin(), in.warnings.end());
    if (!p.fits) {
        // Point at a layout that does fit, when one exists.
        plan::SearchOptions so;
        so.top = 1;
        so.micro_batches = {in.l.micro_batch};
        const plan::SearchResult r = plan::search(in.w, in.c, so);
        if (!r.best.empty()) {
            p.why += "; a layout that fits: " + plan::layout_string(r.best[0].l);
        } else {
            p.why += "; " + plan::fits_nowhere(in.w, in.c, r);
        }
    }
    if (o.json) {
        fmt::print("{}\n", plan::to_json(p, in.c).dump(2));
    } else {
        fmt::print("{}", plan::to_table(p, in.c));
    }
}

void run_search(const Options& o, bool by_cost, int top, bool vary) {
    const core::Config cfg = resolve(o);
    // The layout keys only seed the device count and batch; search varies them.
    const plan::PlanInput in = plan::search_input(cfg);
    plan::SearchOptions so;
    so.by_cost = by_cost;
    so.top = top;
    so.vary_devices = vary;
    const plan::SearchResult r = plan::search(in.w, in.c, so);
    if (r.best.empty()) throw ConfigError(plan::fits_nowhere(in.w, in.c, r));
    if (o.json) {
        nlohmann::json j;
        j["candidates"] = r.candidates;
        j["fitting"] = r.fitting;
        j["seconds"] = r.seconds;
        j["rank_by"] = by_cost ? "cost" : "time";
        for (const auto& [why, n] : r.dropped) {
            j["dropped"][why] = {{"count", n}, {"example", r.example.at(why)}};
        }
        for (size_t i = 0; i < r.best.size(); ++i) {
            plan::Cluster c = in.c;
            c.n = r.best_devices[i];
            j["best"].push_back(plan::to_json(r.best[i], c));
        }
        fmt::print("{}\n", j.dump(2));
        return;
    }
    fmt::print("{} candidates in {:.3f} s: {} fit, ranked by {}\n", r.candidates, r.seconds,
               r.fitting, by_cost ? "cost" : "step time");
    for (const auto& [why, n] : r.dropped) {
        fmt::print("  dropped {:>8}: {} (e.g. {})\n", n, why, r.example.at(why));
    }
    fmt::print("\n{:>4} {:>6} {:<52} {:>9} {:>7} {:>7} {:>9} {:>12}\n", "rank", "devs", "layout",
               "step s", "MFU", "GiB", "days", "cost $");
    for (size_t i = 0; i < r.best.size(); ++i) {
        const auto& p = r.best[i];
        // Days and cost need plan.tokens / --tokens.
        const bool run = p.w.tokens > 0;
        fmt::print("{:>4} {:>6} {:<52} {:>9.4g} {:>6.1f}% {:>7.1f} {:>9} {:>12}\n", i + 1,
                   r.best_devices[i], plan::layout_string(p.l), p.st.total, 100 * p.st.mfu,
                   p.mem.total() / (1024.0 * 1024 * 1024),
                   run ? fmt::format("{:.3g}", p.tot.wall_s / 86400) : "-",
                   run ? fmt::format("{:.4g}", p.tot.cost_usd) : "-");
    }
}

void run_validate(const std::string& file, bool json, bool fit, bool rows) {
    const auto runs = plan::read_validation(file);
    // With --fit, the constants are chosen on the fit split and every run is
    // scored with them (the catalog's should equal them: a test checks it).
    plan::Constants k;
    if (fit) k = plan::fit_constants(runs, full_schema());
    const plan::ValidationReport r = plan::validate(runs, full_schema(), k);
    if (json) {
        nlohmann::json j = plan::to_json(r);
        for (const auto& [name, v] : k) j["fitted"][name] = v;
        fmt::print("{}\n", j.dump(2));
        return;
    }
    if (fit) {
        fmt::print("constants fitted on the fit split (catalog value in brackets):\n");
        for (const auto& [name, v] : k) {
            if (name.rfind("catalog:", 0) == 0) continue;
            fmt::print("  {:<28} {:.4g} ({:.4g})\n", name, v, k.at("catalog:" + name));
        }
        fmt::print("\nwith the fitted constants:\n");
    }
    fmt::print("{}", plan::validation_table(r));
    if (rows) {
        fmt::print("\n{:<36} {:<8} {:<24} {:>11} {:>11} {:>8}\n", "run", "split", "metric",
                   "published", "predicted", "error");
        for (const auto& x : r.rows) {
            fmt::print("{:<36} {:<8} {:<24} {:>11.4g} {:>11.4g} {:>7.1f}%\n", x.run, x.split,
                       x.metric, x.measured, x.predicted, 100 * x.rel_err);
        }
    }
}

void setup(CLI::App& app) {
    auto* cmd = app.add_subcommand(
        "plan", "predict memory, step time, MFU, time, cost, energy and CO2e of a run");
    cmd->require_subcommand(0, 1);
    static Options plan_opts, search_opts;
    add_common(cmd, plan_opts);
    cmd->callback([cmd] {
        if (cmd->get_subcommands().empty()) run_plan(plan_opts);
    });

    auto* s = cmd->add_subcommand("search", "rank every parallel layout that fits");
    add_common(s, search_opts);
    static std::string rank_by = "time";
    static int top = 10;
    static bool vary = false;
    s->add_option("--rank-by", rank_by, "time or cost")->check(CLI::IsMember({"time", "cost"}));
    s->add_option("--top", top, "how many layouts to show");
    s->add_flag("--vary-gpus", vary, "also try 1/2, 1/4, ... of the devices");
    s->callback([] {
        if (top < 1) {
            throw ConfigError(
                fmt::format("--top {}: the number of layouts to show must be at least 1", top));
        }
        run_search(search_opts, rank_by == "cost", top, vary);
    });

    auto* cal = cmd->add_subcommand("calibrate", "fit device constants to measured runs");
    static std::vector<std::string> dirs, holdout;
    static std::string out = "calibration.toml", device;
    cal->add_option("run_dirs", dirs, "run directories (config.toml + metrics.jsonl)")->required();
    cal->add_option("--out", out, "calibration file to write");
    cal->add_option("--device", device, "device the runs ran on (default: their cluster.device)");
    cal->add_option("--holdout", holdout,
                    "run directories not fitted on: predicted before and after, with their error");
    cal->callback([] {
        auto read = [](const std::vector<std::string>& ds) {
            std::vector<plan::RunRecord> runs;
            for (const auto& d : ds) runs.push_back(plan::read_run(d, full_schema(), device));
            return runs;
        };
        const plan::Calibration c = plan::calibrate(read(dirs));
        const auto held = plan::predict(c, read(holdout));
        plan::write_calibration(c, out);
        fmt::print("calibrated {} on {} runs: gemm_eff {:.4g}", c.device, c.runs, c.gemm_eff);
        if (c.mem_eff > 0) fmt::print(", mem_eff {:.4g}", c.mem_eff);
        if (c.gemm_knee > 0) fmt::print(", gemm_knee {:.4g}", c.gemm_knee);
        if (c.intra_bw > 0) fmt::print(", intra bw {:.4g} GB/s", c.intra_bw / 1e9);
        if (c.intra_latency > 0) fmt::print(", latency {:.4g} us", c.intra_latency * 1e6);
        if (!c.at_bound.empty()) {
            fmt::print("\nat the edge of the search range, so not measurable in these runs: {}",
                       fmt::join(c.at_bound, ", "));
        }
        fmt::print("\n{:<9} {:<28} {:<50} {:>6} {:>10} {:>10} {:>10} {:>7}\n", "", "run", "layout",
                   "ranks", "measured s", "before s", "after s", "error");
        auto table = [](const char* kind, const std::vector<plan::Calibration::Row>& rows) {
            for (const auto& r : rows) {
                fmt::print("{:<9} {:<28} {:<50} {:>6} {:>10.4g} {:>10.4g} {:>10.4g} {:>+6.1f}%\n",
                           kind, r.dir, r.layout, r.world_size, r.measured_s, r.before_s, r.after_s,
                           100 * (r.after_s / r.measured_s - 1));
            }
        };
        table("fitted", c.rows);
        table("held out", held);
        fmt::print("rms relative error {:.1f}% -> {:.1f}%", 100 * c.rms_rel_err_before,
                   100 * c.rms_rel_err_after);
        if (!held.empty()) {
            fmt::print("; held out {:.1f}% -> {:.1f}%", 100 * plan::rms_rel_err(held, true),
                       100 * plan::rms_rel_err(held));
        }
        fmt::print("; wrote {}\n", out);
    });

    auto* val = cmd->add_subcommand(
        "validate", "score the planner on published runs (median and p90 error, fit / holdout)");
    static std::string val_file = "tests/plan/validation.toml";
    static bool val_json = false, val_fit = false, val_rows = false;
    val->add_option("file", val_file, "validation set (TOML, [[run]] tables)");
    val->add_flag("--json", val_json, "print one JSON object");
    val->add_flag("--fit", val_fit, "also fit the constants on the fit split and print them");
    val->add_flag("--rows", val_rows, "print every run's figures");
    val->callback([] { run_validate(val_file, val_json, val_fit, val_rows); });

    auto* dev = cmd->add_subcommand("devices", "the hardware catalog");
    dev->callback([] {
        fmt::print("{:<14} {:>9} {:>9} {:>9} {:>8} {:>9} {:>6} {:>9} {:>9}\n", "device", "fp32 TF",
                   "bf16 TF", "fp8 TF", "mem GiB", "mem GB/s", "TDP W", "intra", "inter");
        for (const auto& n : plan::device_names()) {
            const auto& d = plan::device(n);
            fmt::print("{:<14} {:>9.4g} {:>9.4g} {:>9.4g} {:>8.1f} {:>9.0f} {:>6.0f} {:>9} {:>9}\n",
                       n, d.peak_fp32 / 1e12, d.peak_bf16 / 1e12, d.peak_fp8 / 1e12,
                       d.mem_bytes / (1024.0 * 1024 * 1024), d.mem_bw / 1e9, d.tdp_w, d.intra_link,
                       d.inter_link);
        }
        fmt::print("\nlinks: {}\ntopologies: {}\n", fmt::join(plan::link_names(), ", "),
                   fmt::join(plan::topology_names(), ", "));
    });
}

CommandRegistrar reg("plan", setup);

}  // namespace

}  // namespace apiary::cli
