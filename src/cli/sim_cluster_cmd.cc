// `apiary sim cluster`: a job trace on a simulated cluster under one or more
// scheduling policies; a table (or JSON) of each policy's outcomes, per-job
// results, pictures, and for Slurm records how the replay compares.

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <sstream>

#include "cli/sim_cmd.h"
#include "core/error.h"
#include "plan/planner.h"
#include "sim/cluster_sim.h"
#include "sim/pictures.h"
#include "sim/report.h"
#include "sim/slurm.h"
#include "sim/svg.h"
#include "sim/text.h"

namespace apiary::cli {

namespace {

struct Options {
    SimClusterOptions cluster;
    std::string trace, trace_format = "auto", slurm_conf, slurm_devices = "auto";
    std::string policies;
    std::string spot_profile, carbon_profile, shares;
    std::string latency = "auto";
    bool failures = false, json = false;
    double repair_h = 4, half_life_days = 7, horizon_days = 0;
    double ckpt_interval_s = 3600;
    int queue_depth = 0;
    uint64_t seed = 1;
    std::string jobs_out, series_out, svg;
};

std::map<std::string, double> parse_shares(const std::string& text) {
    std::map<std::string, double> m;
    if (text.empty()) return m;
    for (const auto& item : sim::split(text, ',')) {
        const auto eq = item.find('=');
        double v = 0;
        if (eq == std::string::npos || !sim::parse_double(item.substr(eq + 1), &v) || v <= 0) {
            throw ConfigError(
                fmt::format("--shares: '{}' is not account=share with a share > 0 (e.g. --shares "
                            "research=2,prod=1)",
                            item));
        }
        m[item.substr(0, eq)] = v;
    }
    return m;
}

// Spot capacity (nodes) and, optionally, its price over time.
void read_spot(const std::string& path, sim::SimConfig& c) {
    const auto t = sim::read_profile_table(path, {"spot_nodes"}, {"spot_price"});
    const auto& nodes = *t.column("spot_nodes");
    c.spot_nodes = sim::Profile(t.step_s, nodes);
    c.spot_nodes_max = int(std::ceil(*std::max_element(nodes.begin(), nodes.end())));
    if (const auto* price = t.column("spot_price")) c.spot_price = sim::Profile(t.step_s, *price);
}

// Nodes and devices per node: --gpus / cluster.* or, for a replay, slurm.conf.
void size_cluster(const Options& o, const sim::Trace& trace, core::Config& cfg,
                  sim::SlurmConf* slurm) {
    if (!o.slurm_conf.empty()) {
        *slurm = sim::read_slurm_conf(o.slurm_conf);
        const bool gpus = trace.device_unit == "gpus";
        const long long per = gpus ? slurm->gpus_per_node : slurm->cpus_per_node;
        if (per <= 0) {
            throw ConfigError(fmt::format("{}: the trace counts {} but the nodes have none",
                                          o.slurm_conf, gpus ? "GPUs" : "CPUs"));
        }
        cfg.set_value("cluster.gpus", int64_t(slurm->nodes * per), o.slurm_conf);
        cfg.set_value("cluster.gpus_per_node", int64_t(per), o.slurm_conf);
    }
    if (cfg.get_int("cluster.gpus") <= 0) {
        throw ConfigError(
            "sim cluster: how big is the cluster? give --gpus NxDEVICE (e.g. 1024xH100-SXM), "
            "cluster.gpus, or --slurm-conf");
    }
}

sim::SimConfig sim_config(const Options& o, const plan::Cluster& pc, const sim::JobModel& model,
                          const sim::SlurmConf& slurm) {
    sim::SimConfig c;
    c.per_node = int(std::min<long long>(pc.dev.devices_per_node, pc.n));
    if (pc.n % c.per_node != 0) {
        throw ConfigError(
            fmt::format("cluster.gpus = {} is not a whole number of nodes of {} devices: set "
                        "cluster.gpus_per_node to a divisor, or change the count",
                        pc.n, c.per_node));
    }
    c.nodes = int(pc.n / c.per_node);
    c.price_hour = pc.price_hour;
    c.spot_price_hour = pc.spot_price_hour;
    if (!o.carbon_profile.empty()) {
        const auto t = sim::read_profile_table(o.carbon_profile, {"gco2_per_kwh"});
        c.carbon = sim::Profile(t.step_s, t.values[0]);
    } else if (!pc.gco2_profile.empty()) {
        c.carbon = sim::Profile(3600, pc.gco2_profile);
    } else {
        c.carbon = sim::Profile::constant(pc.gco2_per_kwh);
    }
    if (!o.spot_profile.empty()) read_spot(o.spot_profile, c);
    c.idle_kw_per_device = model.device_kw(0);
    c.restart_s = pc.restart_s;
    if (o.latency != "auto" && (!sim::parse_double(o.latency, &c.latency_s) || c.latency_s < 0)) {
        throw ConfigError(fmt::format(
            "--latency-s: '{}' is not seconds >= 0 or 'auto' (from a Slurm record)", o.latency));
    }
    c.mtbf_node_s = o.failures ? pc.mtbf_node_hours * 3600 : 0;
    c.repair_s = o.repair_h * 3600;
    c.queue_depth = o.queue_depth > 0           ? o.queue_depth
                    : slurm.bf_max_job_test > 0 ? int(slurm.bf_max_job_test)
                                                : 1000;
    c.fairshare_half_life_s = o.half_life_days * 86400;
    c.shares = parse_shares(o.shares);
    c.seed = o.seed;
    c.record = !o.svg.empty() || !o.series_out.empty();
    if (o.horizon_days > 0) c.horizon_s = o.horizon_days * 86400;
    return c;
}

std::vector<std::string> policy_list(const Options& o, const sim::SlurmConf& slurm, bool replay) {
    if (!o.policies.empty()) return sim::split(o.policies, ',');
    if (replay) return {slurm.scheduler == "sched/builtin" ? "fifo" : "backfill"};
    return {"fifo", "backfill", "twolevel"};
}

// Everything one `sim cluster` run produced, for its outputs.
struct Outcome {
    sim::Trace trace;
    plan::Cluster pc;
    sim::SimConfig c;
    std::vector<sim::SimJob> jobs;
    std::vector<sim::SimResult> results;
    std::vector<sim::Summary> sums;
    std::vector<std::pair<std::string, sim::ReplayCheck>> checks;
};

void print_text(const Options& o, const Outcome& r) {
    fmt::print("trace {}: {} jobs; cluster: {} nodes x {} {} ({} devices)", o.trace,
               r.trace.jobs.size(), r.c.nodes, r.c.per_node, r.pc.dev.name, r.c.devices());
    if (r.c.spot_nodes_max > 0) fmt::print(" + spot up to {} nodes", r.c.spot_nodes_max);
    fmt::print("\n");
    if (r.c.latency_s > 0) fmt::print("scheduler latency: {:.3g} s\n", r.c.latency_s);
    for (const auto& n : r.trace.notes) fmt::print("note: {}\n", n);
    size_t rejected = 0;
    for (const auto& j : r.jobs) {
        if (j.reject.empty()) continue;
        if (++rejected <= 10) {
            fmt::print("rejected: job '{}' ({}): {}\n", j.spec.id, j.spec.where, j.reject);
        }
    }
    if (rejected > 10) {
        fmt::print("rejected: {} more (every reason is in --jobs-out)\n", rejected - 10);
    }
    fmt::print("\n{}", sim::summary_table(r.sums));
    for (const auto& s : r.sums) {
        fmt::print("{}: {} events in {:.3f} s ({:.3g} events/s){}\n", s.policy, s.events, s.wall_s,
                   s.wall_s > 0 ? double(s.events) / s.wall_s : 0.0,
                   s.node_failures + s.spot_reclaims > 0
                       ? fmt::format("; {} node failures, {} spot reclaims, {} preemptions",
                                     s.node_failures, s.spot_reclaims, s.preemptions)
                       : "");
    }
    for (const auto& [policy, ch] : r.checks) {
        fmt::print(
            "\nreplay under {}: {} jobs; start order {}, end order {}; max |start - Slurm's| "
            "{:.3g} s, max |end - Slurm's| {:.3g} s, mean |start error| {:.3g} s\n",
            policy, ch.compared, ch.same_start_order ? "the same" : "differs",
            ch.same_end_order ? "the same" : "differs", ch.max_start_err_s, ch.max_end_err_s,
            ch.mean_abs_start_err_s);
        if (!ch.first_difference.empty())
            fmt::print("  first difference: {}\n", ch.first_difference);
    }
}

void write_files(const Options& o, const Outcome& r) {
    if (!o.jobs_out.empty()) {
        std::ostringstream s;
        if (o.jobs_out.ends_with(".json")) {
            nlohmann::json j;
            for (const auto& x : r.results) j[x.policy] = sim::jobs_json(r.jobs, x);
            s << j.dump(1) << "\n";
        } else {
            sim::write_jobs_csv(r.jobs, r.results, s);
        }
        write_file_atomically(o.jobs_out, s.str(), "--jobs-out");
    }
    if (!o.series_out.empty()) {
        std::ostringstream s;
        sim::write_series_csv(r.results, s);
        write_file_atomically(o.series_out, s.str(), "--series-out");
    }
    if (!o.svg.empty()) {
        const std::string title = fmt::format("{}: {} jobs on {} x {}",
                                              std::filesystem::path(o.trace).filename().string(),
                                              r.jobs.size(), r.c.devices(), r.pc.dev.name);
        sim::write_picture(sim::cluster_svg(r.results, r.sums, r.c, title), o.svg);
    }
}

void print_json(const Options& o, const Outcome& r) {
    nlohmann::json j;
    j["trace"] = {{"file", o.trace}, {"jobs", r.trace.jobs.size()}, {"notes", r.trace.notes}};
    j["cluster"] = {{"device", r.pc.dev.name},
                    {"nodes", r.c.nodes},
                    {"devices_per_node", r.c.per_node},
                    {"devices", r.c.devices()},
                    {"spot_nodes_max", r.c.spot_nodes_max},
                    {"latency_s", r.c.latency_s}};
    j["rejected"] = nlohmann::json::array();
    for (const auto& x : r.jobs) {
        if (!x.reject.empty()) {
            j["rejected"].push_back(
                {{"id", x.spec.id}, {"where", x.spec.where}, {"reason", x.reject}});
        }
    }
    for (const auto& s : r.sums) j["policies"].push_back(sim::to_json(s));
    for (const auto& [p, ch] : r.checks) j["replay"][p] = sim::to_json(ch);
    fmt::print("{}\n", j.dump(2));
}

void run(const Options& o) {
    core::Config cfg = resolve_sim_config(o.cluster);
    Outcome r;
    r.trace = sim::read_trace(o.trace, sim::parse_trace_format(o.trace_format),
                              sim::parse_slurm_devices(o.slurm_devices));
    sim::SlurmConf slurm;
    size_cluster(o, r.trace, cfg, &slurm);
    bool replay = false;
    for (const auto& j : r.trace.jobs) replay |= j.recorded_start >= 0;
    std::vector<sim::Policy> policies;
    for (const auto& name : policy_list(o, slurm, replay)) {
        policies.push_back(sim::parse_policy(name));
    }
    r.pc = plan::cluster_from(cfg, cfg.get_int("cluster.gpus"));
    sim::JobModel model(cfg, r.pc, o.ckpt_interval_s);
    r.c = sim_config(o, r.pc, model, slurm);
    if (o.latency == "auto") r.c.latency_s = sim::record_latency_s(r.trace);
    r.jobs = sim::prepare_jobs(r.trace, model, r.c);
    for (const auto& p : policies) {
        r.results.push_back(sim::simulate(r.jobs, r.c, p));
        r.sums.push_back(sim::summarize(r.jobs, r.results.back()));
        if (replay) r.checks.emplace_back(p.name, sim::check_replay(r.jobs, r.results.back()));
    }
    write_files(o, r);
    if (o.json) {
        print_json(o, r);
    } else {
        print_text(o, r);
    }
}

}  // namespace

void add_sim_cluster(CLI::App* sim) {
    auto* cmd = sim->add_subcommand("cluster", "run a job trace under scheduling policies");
    static Options o;
    add_sim_cluster_options(cmd, o.cluster);
    cmd->add_option("--trace", o.trace,
                    "jobs: CSV/JSON (docs/sim.md), sacct --parsable2 output "
                    "or a jobcomp/filetxt log")
        ->required();
    cmd->add_option("--trace-format", o.trace_format, "auto, csv, json, sacct or jobcomp");
    cmd->add_option("--slurm-conf", o.slurm_conf,
                    "slurm.conf: the cluster's nodes and Slurm's scheduler (the default policy)");
    cmd->add_option("--slurm-devices", o.slurm_devices,
                    "what a Slurm job's devices are: auto (GPUs if any record has them), cpus, "
                    "gpus");
    cmd->add_option("--policies", o.policies,
                    "comma-separated: fifo, backfill, priority, twolevel, each with optional "
                    "+preempt, +carbon (default fifo,backfill,twolevel; Slurm's with "
                    "--slurm-conf)");
    cmd->add_option("--spot-profile", o.spot_profile,
                    "CSV hour,spot_nodes[,spot_price]: spot capacity and USD per device-hour");
    cmd->add_option("--carbon-profile", o.carbon_profile,
                    "CSV hour,gco2_per_kwh (or one value per line, hourly); default "
                    "cluster.carbon_profile or cluster.gco2_per_kwh");
    cmd->add_flag("--failures", o.failures, "nodes fail at cluster.mtbf_node_hours");
    cmd->add_option("--repair-hours", o.repair_h, "a failed node is back after this")
        ->check(CLI::Range(0.0, 1e6));
    cmd->add_option("--latency-s", o.latency,
                    "the scheduler starts a job this long after it arrives or after the end "
                    "that frees its devices; auto: measured from a Slurm record, else 0");
    cmd->add_option("--queue-depth", o.queue_depth,
                    "queued jobs looked at per pass (default 1000, or bf_max_job_test)")
        ->check(CLI::Range(1, 100000000));
    cmd->add_option("--fairshare-half-life-days", o.half_life_days,
                    "decay of account usage in the two-level queue (0: none)")
        ->check(CLI::Range(0.0, 1e6));
    cmd->add_option("--shares", o.shares, "account shares, e.g. research=2,prod=1 (default 1)");
    cmd->add_option("--checkpoint-interval-s", o.ckpt_interval_s,
                    "checkpoint interval of jobs without a model (0: continuous)")
        ->check(CLI::Range(0.0, 1e9));
    cmd->add_option("--horizon-days", o.horizon_days, "stop after this (0: when all jobs end)")
        ->check(CLI::Range(0.0, 1e6));
    cmd->add_option("--seed", o.seed, "seed of the failure times");
    cmd->add_option("--jobs-out", o.jobs_out, "per-job results: .csv or .json");
    cmd->add_option("--series-out", o.series_out,
                    "CSV of the cluster over time: busy and available devices, queued jobs");
    cmd->add_option("--svg", o.svg, "picture: .svg, or .png through rsvg-convert");
    cmd->add_flag("--json", o.json, "print one JSON object");
    cmd->callback([] { run(o); });
}

}  // namespace apiary::cli
