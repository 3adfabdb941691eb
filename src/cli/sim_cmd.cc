// `apiary sim`: simulate a training cluster over time. `sim cluster` runs a
// job trace (apiary's CSV/JSON or Slurm's own records) under scheduling
// policies; `sim comm` runs collectives of several jobs on one fabric;
// `sim trace` writes a synthetic trace. docs/sim.md.

#include "cli/sim_cmd.h"

#include <fmt/format.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cli/command.h"
#include "core/error.h"
#include "plan/catalog.h"
#include "sim/synth.h"
#include "sim/trace.h"

namespace apiary::cli {

void add_sim_cluster_options(CLI::App* cmd, SimClusterOptions& o) {
    cmd->add_option("--gpus", o.gpus, "devices, e.g. 1024xH100-SXM (cluster.gpus, cluster.device)");
    cmd->add_option("--config", o.config_file, "TOML config with a [cluster] table");
    cmd->add_option("--cluster", o.cluster_file, "TOML file with a [cluster] table");
    cmd->add_option("--set", o.sets, "key=value override (repeatable), e.g. cluster.topology=...");
}

core::Config resolve_sim_config(const SimClusterOptions& o) {
    std::vector<std::string> sets;
    if (!o.gpus.empty()) {
        const plan::GpuSpec g = plan::parse_gpus(o.gpus);
        if (g.count > 0) sets.push_back(fmt::format("cluster.gpus={}", g.count));
        if (!g.device.empty()) sets.push_back("cluster.device=" + g.device);
    }
    sets.insert(sets.end(), o.sets.begin(), o.sets.end());
    core::Config cfg = load_config(o.config_file, {});
    if (!o.cluster_file.empty()) cfg.load_file(o.cluster_file);
    for (const auto& s : sets) cfg.set(s);
    return cfg;
}

void write_file_atomically(const std::string& path, const std::string& text, const char* what) {
    const std::string tmp = path + ".tmp";
    {
        std::ofstream out(tmp, std::ios::binary);
        if (!out) throw IoError(fmt::format("{}: cannot write '{}'", what, tmp));
        out << text;
        if (!out.flush()) throw IoError(fmt::format("{}: writing '{}' failed", what, tmp));
    }
    std::filesystem::rename(tmp, path);
}

namespace {

void add_trace(CLI::App* sim) {
    auto* cmd = sim->add_subcommand("trace", "write a synthetic job trace (CSV)");
    static sim::SynthOptions o;
    static std::string gpus, out;
    static double median_h = 1;
    cmd->add_option("--jobs", o.jobs, "number of jobs")->check(CLI::Range(1LL, 100000000LL));
    cmd->add_option("--gpus", gpus, "the cluster the load is offered to, e.g. 10000xH100-SXM")
        ->required();
    cmd->add_option("--load", o.load, "offered load: device-seconds per device-second")
        ->check(CLI::Range(1e-6, 100.0));
    cmd->add_option("--max-job-devices", o.max_devices, "largest job (default: a quarter)");
    cmd->add_option("--median-runtime-h", median_h, "median run time, hours (lognormal)")
        ->check(CLI::Range(1e-3, 1e4));
    cmd->add_option("--runtime-sigma", o.runtime_sigma, "sigma of log(run time)")
        ->check(CLI::Range(0.0, 5.0));
    cmd->add_option("--spot-frac", o.spot_frac, "share of spot jobs")->check(CLI::Range(0.0, 1.0));
    cmd->add_option("--flexible-frac", o.flexible_frac, "share of flexible (carbon-shiftable) jobs")
        ->check(CLI::Range(0.0, 1.0));
    cmd->add_option("--slack-h", o.slack_h, "a flexible job's deadline: up to this many hours late")
        ->check(CLI::Range(0.0, 1e5));
    cmd->add_option("--high-priority-frac", o.high_priority_frac, "share of priority-1 jobs")
        ->check(CLI::Range(0.0, 1.0));
    cmd->add_option("--accounts", o.accounts, "accounts the jobs belong to")
        ->check(CLI::Range(1, 100000));
    cmd->add_option("--seed", o.seed, "random seed");
    cmd->add_option("--out", out, "CSV file to write (default: standard output)");
    cmd->callback([] {
        const plan::GpuSpec g = plan::parse_gpus(gpus);
        if (g.count <= 0) throw ConfigError("sim trace --gpus: give a count, e.g. 1024xH100-SXM");
        o.devices = g.count;
        o.median_runtime_s = median_h * 3600;
        std::ostringstream s;
        sim::write_trace_csv(sim::synthesize(o), s);
        if (out.empty()) {
            fmt::print("{}", s.str());
        } else {
            write_file_atomically(out, s.str(), "sim trace --out");
            fmt::print(stderr, "wrote {} jobs to {}\n", o.jobs, out);
        }
    });
}

void setup(CLI::App& app) {
    auto* sim = app.add_subcommand(
        "sim", "simulate a cluster over time: job scheduling, and collectives on a fabric");
    sim->require_subcommand(1);
    add_sim_cluster(sim);
    add_sim_fit(sim);
    add_sim_comm(sim);
    add_trace(sim);
}

CommandRegistrar reg("sim", setup);

}  // namespace

}  // namespace apiary::cli
