// `apiary sim cluster`: a job trace on a simulated cluster under one or more
// scheduling policies; a table (or JSON) of each policy's outcomes, per-job
// results, pictures, and for Slurm records how the replay compares.

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>

#include "cli/sim_cmd.h"
#include "core/error.h"
#include "core/timing.h"
#include "plan/planner.h"
#include "sim/cluster_sim.h"
#include "sim/fit.h"
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
    long long procs_per_node = 1;
    uint64_t seed = 1;
    std::string jobs_out, series_out, svg;
    std::vector<std::string> capacity;
    std::string capacity_out;
    double implied_gap_h = 2;
    std::string priority_weights;
    double max_age_days = -1;  // < 0: slurm.conf's PriorityMaxAge, else 7
    bool half_life_given = false;
    double warmup_fraction = 0;
    std::string limits;
    int bf_max_job_test = 1;
    double bf_window_min = -1;
    bool favor_small = false;
    double infer_users_min = 0;  // 0: users as the log names them
    long long user_max_jobs = -1;
    int bf_max_job_user = 0;
    int nodes_per_leaf = 0;
    double bf_min_age_reserve_h = -1;
    double fit_fraction = 0.5;  // sim fit
};

// --priority-weights age=1000,size=500,fairshare=2000 onto the config.
void parse_weights(const std::string& text, sim::SimConfig& c) {
    for (const auto& item : sim::split(text, ',')) {
        const auto eq = item.find('=');
        const std::string key = sim::trim(item.substr(0, eq));
        double v = 0;
        if (eq == std::string::npos || !sim::parse_double(item.substr(eq + 1), &v) || v < 0) {
            throw ConfigError(fmt::format(
                "--priority-weights: '{}' is not factor=weight with a weight >= 0 (e.g. "
                "--priority-weights age=1000,size=500,fairshare=2000)",
                sim::printable(item)));
        }
        if (key == "age") {
            c.weight_age = v;
        } else if (key == "size") {
            c.weight_size = v;
        } else if (key == "fairshare") {
            c.weight_fairshare = v;
        } else {
            throw ConfigError(
                fmt::format("--priority-weights: unknown factor '{}' (known: age, size, fairshare)",
                            sim::printable(key)));
        }
    }
}

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
    if (trace.device_unit == "nodes") {
        // SWF: a job's size is nodes; the header's MaxNodes is the default size.
        if (cfg.get_int("cluster.gpus") <= 0 && trace.max_nodes > 0) {
            cfg.set_value("cluster.gpus", int64_t(trace.max_nodes), o.trace + " header");
        }
        cfg.set_value("cluster.gpus_per_node", int64_t(1), "an SWF trace (jobs count nodes)");
    }
    if (!o.slurm_conf.empty() && trace.device_unit == "nodes") {
        *slurm = sim::read_slurm_conf(o.slurm_conf, false);  // its scheduling keys only
    } else if (!o.slurm_conf.empty()) {
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
            "cluster.gpus, --slurm-conf, or an SWF trace with a MaxNodes / MaxProcs header");
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
    c.fairshare_half_life_s = !o.half_life_given && slurm.decay_half_life_s >= 0
                                  ? slurm.decay_half_life_s
                                  : o.half_life_days * 86400;
    if (slurm.calc_period_s >= 0) c.priority_calc_period_s = slurm.calc_period_s;
    if (slurm.weight_age >= 0) c.weight_age = slurm.weight_age;
    if (slurm.weight_size >= 0) c.weight_size = slurm.weight_size;
    if (slurm.weight_fairshare >= 0) c.weight_fairshare = slurm.weight_fairshare;
    if (!o.priority_weights.empty()) parse_weights(o.priority_weights, c);
    c.favor_small = o.favor_small || slurm.favor_small == 1;
    if (o.max_age_days >= 0) {
        c.priority_max_age_s = o.max_age_days * 86400;
    } else if (slurm.priority_max_age_s >= 0) {
        c.priority_max_age_s = slurm.priority_max_age_s;
    }
    c.shares = parse_shares(o.shares);
    if (!o.limits.empty()) c.limits = sim::read_limits(o.limits);
    if (o.user_max_jobs >= 0) c.limits.user["*"].max_jobs = o.user_max_jobs;
    c.bf_max_job_test = o.bf_max_job_test;
    c.nodes_per_leaf = o.nodes_per_leaf;
    c.bf_min_age_reserve_s = o.bf_min_age_reserve_h >= 0
                                 ? o.bf_min_age_reserve_h * 3600
                                 : std::max(0.0, slurm.bf_min_age_reserve_s);
    c.bf_max_job_user = o.bf_max_job_user > 0 ? o.bf_max_job_user : int(slurm.bf_max_job_user);
    if (o.bf_window_min > 0) {
        c.bf_window_s = o.bf_window_min * 60;
    } else if (slurm.bf_window_s > 0) {
        c.bf_window_s = slurm.bf_window_s;
    }
    c.seed = o.seed;
    c.record = !o.svg.empty() || !o.series_out.empty();
    if (o.horizon_days > 0) c.horizon_s = o.horizon_days * 86400;
    return c;
}

std::vector<std::string> policy_list(const Options& o, const sim::SlurmConf& slurm, bool replay) {
    if (!o.policies.empty()) return sim::split(o.policies, ',');
    if (replay && !o.slurm_conf.empty()) {
        const bool builtin = slurm.scheduler == "sched/builtin";
        if (slurm.priority_type == "priority/multifactor") {
            return {builtin ? "multifactor-fifo" : "multifactor"};
        }
        return {builtin ? "fifo" : "backfill"};
    }
    if (replay) return {"backfill"};
    return {"fifo", "backfill", "twolevel"};
}

// The trace (--slurm-devices, --procs-per-node), with users inferred when
// asked (--infer-users).
sim::Trace read_log(const Options& o) {
    sim::ReadOptions ro;
    ro.devices = sim::parse_slurm_devices(o.slurm_devices);
    ro.procs_per_node = o.procs_per_node;
    sim::Trace t = sim::read_trace(o.trace, sim::parse_trace_format(o.trace_format), ro);
    if (o.infer_users_min > 0) {
        const long long n = sim::infer_users(t, o.infer_users_min * 60);
        t.notes.push_back(
            n > 0 ? fmt::format("--infer-users: {} users inferred (jobs of one size and time limit "
                                "submitted at most {:g} min apart are one user's)",
                                n, o.infer_users_min)
                  : "--infer-users: the log names its users; none inferred");
    }
    return t;
}

// Whether the log records any job's start (a replay can be checked, waits fitted).
bool records_starts(const sim::Trace& t) {
    bool recorded = false;
    for (const auto& j : t.jobs) recorded |= j.recorded_start >= 0;
    return recorded;
}

double last_submit(const sim::Trace& t) {
    double last = 0;
    for (const auto& j : t.jobs) last = std::max(last, j.submit);
    return last;
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
    int implied_outages = -1;  // --capacity implied: outages found
};

// --capacity: files merged into one timeline, or the capacity the log implies.
void set_capacity(const Options& o, Outcome& r) {
    if (o.capacity.empty()) return;
    const bool implied =
        std::find(o.capacity.begin(), o.capacity.end(), "implied") != o.capacity.end();
    if (implied) {
        if (o.capacity.size() > 1) {
            throw ConfigError(
                "--capacity implied infers the whole timeline from the log: give it alone, "
                "without capacity files");
        }
        if (!records_starts(r.trace)) {
            throw ConfigError(fmt::format(
                "--capacity implied: {} records no starts (SWF wait -1, or no Start in Slurm's "
                "record): there is nothing to infer capacity from",
                o.trace));
        }
        auto steps = sim::implied_capacity(r.trace, r.c.devices(), o.implied_gap_h * 3600,
                                           &r.implied_outages);
        for (auto& s : steps) s.nodes = (s.nodes + r.c.per_node - 1) / r.c.per_node;
        r.c.capacity = std::move(steps);
        return;
    }
    sim::CapacityInput in;
    for (const auto& f : o.capacity) sim::read_capacity_csv(f, in, r.trace.origin_epoch);
    r.c.capacity = sim::capacity_timeline(in, r.c.nodes);
}

// The cluster of cfg (r.pc) and the simulator's setting on it (r.c: Slurm's
// reaction latency from its records under --latency-s auto, --capacity);
// returns the model of the jobs' costs on r.pc.
sim::JobModel set_up_cluster(const Options& o, const core::Config& cfg, const sim::SlurmConf& slurm,
                             Outcome& r) {
    r.pc = plan::cluster_from(cfg, cfg.get_int("cluster.gpus"));
    sim::JobModel model(cfg, r.pc, o.ckpt_interval_s);
    r.c = sim_config(o, r.pc, model, slurm);
    // Only Slurm's own records say how fast its controller reacted.
    if (o.latency == "auto" && r.trace.slurm) r.c.latency_s = sim::record_latency_s(r.trace);
    set_capacity(o, r);
    return model;
}

void print_text(const Options& o, const Outcome& r) {
    if (r.trace.device_unit == "nodes") {
        fmt::print("trace {}: {} jobs; cluster: {} nodes (jobs count nodes)", o.trace,
                   r.trace.jobs.size(), r.c.nodes);
    } else {
        fmt::print("trace {}: {} jobs; cluster: {} nodes x {} {} ({} devices)", o.trace,
                   r.trace.jobs.size(), r.c.nodes, r.c.per_node, r.pc.dev.name, r.c.devices());
    }
    if (r.c.spot_nodes_max > 0) fmt::print(" + spot up to {} nodes", r.c.spot_nodes_max);
    fmt::print("\n");
    if (r.c.latency_s > 0) fmt::print("scheduler latency: {:.3g} s\n", r.c.latency_s);
    if (!r.c.capacity.empty()) {
        long long lo = r.c.nodes;
        for (const auto& s : r.c.capacity) lo = std::min(lo, s.nodes);
        fmt::print("capacity: {} steps, down to {} of {} nodes{}\n", r.c.capacity.size(), lo,
                   r.c.nodes,
                   r.implied_outages >= 0
                       ? fmt::format(" (implied by the log: {} outages of {} h or more)",
                                     r.implied_outages, o.implied_gap_h)
                       : "");
    }
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
        fmt::print("{}: {} events in {:.3f} s ({:.3g} events/s){}{}\n", s.policy, s.events,
                   s.wall_s, s.wall_s > 0 ? double(s.events) / s.wall_s : 0.0,
                   (r.c.per_node > 1
                        ? fmt::format("; {:.4g} idle device-h on partly busy nodes "
                                      "({:.1f}% of idle)",
                                      s.fragmented_device_hours, 100 * s.fragmented_idle_share)
                        : std::string()) +
                       (r.c.nodes_per_leaf > 0
                            ? fmt::format("; {} of {} runs that fit in a leaf spread over more",
                                          s.leaf_split_runs, s.leaf_fit_runs)
                            : std::string()),
                   s.node_failures + s.spot_reclaims > 0
                       ? fmt::format("; {} node failures, {} spot reclaims, {} preemptions",
                                     s.node_failures, s.spot_reclaims, s.preemptions)
                       : "");
    }
    const char* who = r.trace.slurm ? "Slurm's" : "recorded";
    for (const auto& [policy, ch] : r.checks) {
        fmt::print(
            "\nreplay under {}: {} jobs; start order {}, end order {}; max |start - {}| "
            "{:.3g} s, max |end - {}| {:.3g} s, mean |start error| {:.3g} s\n",
            policy, ch.compared, ch.same_start_order ? "the same" : "differs",
            ch.same_end_order ? "the same" : "differs", who, ch.max_start_err_s, who,
            ch.max_end_err_s, ch.mean_abs_start_err_s);
        if (!ch.first_difference.empty())
            fmt::print("  first difference: {}\n", ch.first_difference);
        if (ch.waits_compared > 0) {
            fmt::print(
                "  waits of {} jobs submitted from {}: mean {} (recorded {}, ratio {:.3g}), p90 {} "
                "(recorded {}, ratio {:.3g}), Spearman {:.3f}\n",
                ch.waits_compared, sim::format_duration(ch.from),
                sim::format_duration(ch.mean_wait_s), sim::format_duration(ch.recorded_mean_wait_s),
                ch.recorded_mean_wait_s > 0 ? ch.mean_wait_s / ch.recorded_mean_wait_s : 0.0,
                sim::format_duration(ch.p90_wait_s), sim::format_duration(ch.recorded_p90_wait_s),
                ch.recorded_p90_wait_s > 0 ? ch.p90_wait_s / ch.recorded_p90_wait_s : 0.0,
                ch.spearman_wait);
        }
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
    if (!o.capacity_out.empty()) {
        std::ostringstream s;
        sim::write_capacity_csv(r.c.capacity.empty()
                                    ? std::vector<sim::CapacityStep>{{0, r.c.nodes, false}}
                                    : r.c.capacity,
                                s);
        write_file_atomically(o.capacity_out, s.str(), "--capacity-out");
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
    r.trace = read_log(o);
    sim::SlurmConf slurm;
    size_cluster(o, r.trace, cfg, &slurm);
    const bool replay = records_starts(r.trace);
    std::vector<sim::Policy> policies;
    for (const auto& name : policy_list(o, slurm, replay)) {
        policies.push_back(sim::parse_policy(name));
    }
    sim::JobModel model = set_up_cluster(o, cfg, slurm, r);
    r.jobs = sim::prepare_jobs(r.trace, model, r.c);
    // Jobs submitted in the first --warmup-fraction of the log warm the queue up.
    const double compare_from = o.warmup_fraction * last_submit(r.trace);
    for (const auto& p : policies) {
        r.results.push_back(sim::simulate(r.jobs, r.c, p));
        r.sums.push_back(sim::summarize(r.jobs, r.results.back()));
        if (replay) {
            r.checks.emplace_back(p.name,
                                  sim::check_replay(r.jobs, r.results.back(), compare_from));
        }
    }
    write_files(o, r);
    if (o.json) {
        print_json(o, r);
    } else {
        print_text(o, r);
    }
}

// ---- `apiary sim fit` ----

// One row of the report: a group of jobs and their waits.
struct FitRow {
    std::string group;
    sim::WaitStats waits;
};

struct FitOutcome {
    sim::Trace trace;
    sim::SimConfig c;
    double fit_end = 0, warm_end = 0, search_s = 0;
    std::vector<sim::FitTry> tried;  // in the grid's order
    size_t best = 0;
    std::vector<sim::SimJob> jobs;  // the whole log
    sim::SimResult result;          // under the chosen setting
    std::vector<FitRow> rows;       // "all", then by size, then by month
};

// The jobs submitted before `t` (a job waiting for one that is left out
// waits for nothing).
sim::Trace head_of(const sim::Trace& t, double before) {
    sim::Trace h = t;
    h.jobs.clear();
    for (const auto& j : t.jobs) {
        if (j.submit < before) h.jobs.push_back(j);
    }
    return h;
}

FitOutcome fit_log(const Options& o) {
    core::Config cfg = resolve_sim_config(o.cluster);
    Outcome r;
    r.trace = read_log(o);
    if (!records_starts(r.trace)) {
        throw ConfigError(fmt::format(
            "sim fit: {} records no starts (SWF wait -1, or no Start in Slurm's record): there "
            "are no waits to fit to; `apiary sim cluster` still simulates it",
            o.trace));
    }
    sim::SlurmConf slurm;
    size_cluster(o, r.trace, cfg, &slurm);
    // Given capacity is kept; without, the grid tries the implied one.
    sim::JobModel model = set_up_cluster(o, cfg, slurm, r);
    r.c.record = false;
    const std::vector<std::string> policies =
        o.policies.empty() ? std::vector<std::string>{"fifo", "backfill", "multifactor", "wfp"}
                           : sim::split(o.policies, ',');
    for (const auto& p : policies) {
        const sim::Policy parsed = sim::parse_policy(p);
        if (parsed.preempt || parsed.carbon || parsed.order == sim::Order::priority ||
            parsed.order == sim::Order::fairshare) {
            throw ConfigError(fmt::format(
                "sim fit --policies: '{}' has nothing to fit in a log (known here: fifo, "
                "backfill, multifactor, multifactor-fifo, wfp)",
                p));
        }
    }
    FitOutcome f;
    f.c = r.c;
    f.fit_end = o.fit_fraction * last_submit(r.trace);
    f.warm_end = f.fit_end / 2;
    const sim::Trace head = head_of(r.trace, f.fit_end);
    const auto head_jobs = sim::prepare_jobs(head, model, r.c);
    std::set<std::string> users, accounts;
    for (const auto& j : r.trace.jobs) users.insert(j.user), accounts.insert(j.account);
    const bool fairshare = users.size() > 1 || accounts.size() > 1;
    const auto grid = sim::fit_grid(policies, o.capacity.empty(), fairshare,
                                    users.size() > 1 && o.limits.empty());
    const auto t0 = core::Clock::now();
    f.tried = sim::fit_search(head, head_jobs, r.c, grid, f.warm_end, &f.best);
    f.search_s = core::seconds_since(t0);
    // The chosen setting, unchanged, on the whole log.
    const sim::Policy p = sim::apply_setting(f.tried[f.best].setting, r.trace, f.c);
    f.jobs = sim::prepare_jobs(r.trace, model, f.c);
    f.result = sim::simulate(f.jobs, f.c, p);
    f.trace = std::move(r.trace);
    const auto& jobs = f.jobs;
    auto later = [&](size_t j) { return jobs[j].spec.submit >= f.fit_end; };
    f.rows.push_back({"all", sim::wait_stats(jobs, f.result, later)});
    auto groups = [&](const char* what, auto key_of) {
        std::map<std::pair<double, std::string>, std::vector<size_t>> by;
        for (size_t j = 0; j < jobs.size(); ++j) by[key_of(j)].push_back(j);
        for (const auto& [key, members] : by) {
            std::vector<char> in(jobs.size(), 0);
            for (size_t j : members) in[j] = 1;
            const auto w =
                sim::wait_stats(jobs, f.result, [&](size_t j) { return in[j] && later(j); });
            if (w.n > 0) f.rows.push_back({fmt::format("{} {}", what, key.second), w});
        }
    };
    const int per = f.c.per_node;
    groups("nodes", [&](size_t j) {
        const long long n = (jobs[j].spec.devices + per - 1) / per;
        return std::pair<double, std::string>(
            double(n <= 1 ? 1 : std::bit_ceil((unsigned long long)n)), sim::size_class(n));
    });
    const bool epoch = f.trace.origin_epoch > 0;
    groups("month", [&](size_t j) {
        const std::string m = sim::month_of(f.trace.origin_epoch, epoch, jobs[j].spec.submit);
        return std::pair<double, std::string>(
            epoch ? 0.0 : std::floor(jobs[j].spec.submit / (30 * 86400.0)), m);
    });
    return f;
}

std::string ratio(double a, double b) { return b > 0 ? fmt::format("{:.2f}", a / b) : "-"; }

void print_fit(const Options& o, const FitOutcome& f) {
    using sim::format_duration;
    fmt::print("trace {}: {} jobs; cluster: {} nodes{}\n", o.trace, f.trace.jobs.size(), f.c.nodes,
               f.c.per_node > 1 ? fmt::format(" x {} devices", f.c.per_node) : "");
    for (const auto& n : f.trace.notes) fmt::print("note: {}\n", n);
    const auto& best = f.tried[f.best];
    fmt::print(
        "\nfit: the jobs submitted before {} (--fit-fraction {:g}) simulated alone, {} settings in "
        "{:.1f} s; scored on the waits of the {} submitted from {} (the earlier ones warm the "
        "queue up), by |ln(mean ratio)| + |ln(p90 ratio)| + (1 - Spearman)\n",
        format_duration(f.fit_end), o.fit_fraction, f.tried.size(), f.search_s, best.waits.n,
        format_duration(f.warm_end));
    std::vector<size_t> order(f.tried.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return f.tried[a].score < f.tried[b].score; });
    fmt::print("{:>7} {:>6} {:>6} {:>8}  setting (best 5)\n", "score", "mean", "p90", "Spearman");
    for (size_t k = 0; k < std::min<size_t>(5, order.size()); ++k) {
        const auto& t = f.tried[order[k]];
        fmt::print("{:>7.3f} {:>6} {:>6} {:>8.3f}  {}\n", t.score,
                   ratio(t.waits.mean, t.waits.rec_mean), ratio(t.waits.p90, t.waits.rec_p90),
                   t.waits.spearman, t.setting.name());
    }
    fmt::print("chosen: {}\n", best.setting.name());
    fmt::print(
        "\nthe rest: jobs submitted from {}, the chosen setting on the whole log; waits simulated "
        "/ recorded\n",
        format_duration(f.fit_end));
    fmt::print("{:<18} {:>6} {:>15} {:>6} {:>15} {:>15} {:>6} {:>8}\n", "group", "jobs",
               "mean sim/rec", "ratio", "p50 sim/rec", "p90 sim/rec", "ratio", "Spearman");
    for (const auto& row : f.rows) {
        const auto& w = row.waits;
        fmt::print("{:<18} {:>6} {:>15} {:>6} {:>15} {:>15} {:>6} {:>8.3f}\n", row.group, w.n,
                   format_duration(w.mean) + "/" + format_duration(w.rec_mean),
                   ratio(w.mean, w.rec_mean),
                   format_duration(w.p50) + "/" + format_duration(w.rec_p50),
                   format_duration(w.p90) + "/" + format_duration(w.rec_p90),
                   ratio(w.p90, w.rec_p90), w.spearman);
    }
    const auto& all = f.rows[0].waits;
    auto within = [](double a, double b, double tol) {
        return b > 0 && std::abs(a / b - 1) <= tol;
    };
    fmt::print("targets (mean and p90 within 25%, Spearman >= 0.5): mean {}, p90 {}, Spearman {}\n",
               within(all.mean, all.rec_mean, 0.25) ? "met" : "not met",
               within(all.p90, all.rec_p90, 0.25) ? "met" : "not met",
               all.spearman >= 0.5 ? "met" : "not met");
}

nlohmann::json to_json(const sim::WaitStats& w) {
    return {{"jobs", w.n},
            {"mean_wait_s", w.mean},
            {"p50_wait_s", w.p50},
            {"p90_wait_s", w.p90},
            {"recorded_mean_wait_s", w.rec_mean},
            {"recorded_p50_wait_s", w.rec_p50},
            {"recorded_p90_wait_s", w.rec_p90},
            {"spearman_wait", w.spearman}};
}

void print_fit_json(const Options& o, const FitOutcome& f) {
    nlohmann::json j;
    j["trace"] = {{"file", o.trace}, {"jobs", f.trace.jobs.size()}, {"notes", f.trace.notes}};
    j["cluster"] = {{"nodes", f.c.nodes}, {"devices_per_node", f.c.per_node}};
    j["fit"] = {{"fit_fraction", o.fit_fraction},
                {"fit_end_s", f.fit_end},
                {"scored_from_s", f.warm_end},
                {"search_s", f.search_s},
                {"chosen", f.tried[f.best].setting.name()}};
    for (const auto& t : f.tried) {
        j["fit"]["tried"].push_back(
            {{"setting", t.setting.name()}, {"score", t.score}, {"waits", to_json(t.waits)}});
    }
    j["rest"] = nlohmann::json::array();  // "all", then by size, then by month, in order
    for (const auto& row : f.rows) {
        auto w = to_json(row.waits);
        w["group"] = row.group;
        j["rest"].push_back(w);
    }
    fmt::print("{}\n", j.dump(2));
}

void run_fit(const Options& o) {
    FitOutcome f = fit_log(o);
    f.result.policy = f.tried[f.best].setting.policy;
    if (!o.jobs_out.empty()) {
        std::ostringstream s;
        if (o.jobs_out.ends_with(".json")) {
            nlohmann::json j;
            j[f.result.policy] = sim::jobs_json(f.jobs, f.result);
            s << j.dump(1) << "\n";
        } else {
            sim::write_jobs_csv(f.jobs, {f.result}, s);
        }
        write_file_atomically(o.jobs_out, s.str(), "--jobs-out");
    }
    if (o.json) {
        print_fit_json(o, f);
    } else {
        print_fit(o, f);
    }
}

// Options `sim cluster` and `sim fit` share: the trace, the cluster and what
// is not searched.
void add_trace_options(CLI::App* cmd, Options& o) {
    add_sim_cluster_options(cmd, o.cluster);
    cmd->add_option("--trace", o.trace,
                    "jobs: CSV/JSON (docs/sim.md), sacct --parsable2 output, "
                    "a jobcomp/filetxt log or SWF (.swf or .swf.gz)")
        ->required();
    cmd->add_option("--trace-format", o.trace_format,
                    "auto, csv, json, sacct, jobcomp or swf (the Parallel Workloads Archive's "
                    "Standard Workload Format); any may be gzipped");
    cmd->add_option("--procs-per-node", o.procs_per_node,
                    "SWF: processors per node; a job's nodes = ceil(processors / this), the "
                    "cluster's = MaxNodes, else MaxProcs / this (default 1)")
        ->check(CLI::Range(1LL, 1000000000LL));
    cmd->add_option("--slurm-conf", o.slurm_conf,
                    "slurm.conf: the cluster's nodes, Slurm's scheduler and priority plugin (the "
                    "default policy) and its PriorityWeight*, PriorityMaxAge and "
                    "PriorityDecayHalfLife (for an SWF trace only these keys)");
    cmd->add_option("--slurm-devices", o.slurm_devices,
                    "what a Slurm job's devices are: auto (GPUs if any record has them), cpus, "
                    "gpus");
    cmd->add_option("--capacity", o.capacity,
                    "nodes available over time: CSV time,available_nodes, time,event,nodes "
                    "(drain/down/resume of named nodes), start,end,nodes (reservations) or "
                    "sacctmgr show event --parsable2 output, repeatable; or 'implied': the "
                    "capacity the log's recorded starts imply");
    cmd->add_option("--implied-gap-hours", o.implied_gap_h,
                    "--capacity implied: a queued job that fits but nothing starts for this long "
                    "is an outage (default 2)")
        ->check(CLI::Range(0.0, 1e6));
    cmd->add_option("--latency-s", o.latency,
                    "seconds the scheduler takes to react: a job is first considered this long "
                    "after it arrives, and a job's devices are free this long after it ends (not "
                    "busy in between); auto (default): measured from a Slurm record (sacct, "
                    "jobcomp), 0 for every other trace (SWF, CSV, JSON, recorded starts or not)");
    cmd->add_option("--queue-depth", o.queue_depth,
                    "queued jobs looked at per pass (default 1000, or bf_max_job_test)")
        ->check(CLI::Range(1, 100000000));
    cmd->add_option("--fairshare-half-life-days", o.half_life_days,
                    "decay of usage in the two-level queue and multifactor fair share (0: none; "
                    "default 7, or slurm.conf's PriorityDecayHalfLife)")
        ->check(CLI::Range(0.0, 1e6))
        ->each([&o](const std::string&) { o.half_life_given = true; });
    cmd->add_option("--infer-users", o.infer_users_min,
                    "a log that names no users (or one): jobs of one size and time limit "
                    "submitted at most this many minutes apart are one user's (0: off, the "
                    "default)")
        ->check(CLI::Range(0.0, 1e6));
    cmd->add_option("--limits", o.limits,
                    "CSV kind,name,max_running_jobs,max_nodes: per-user / per-account limits "
                    "(kind user or account, name * for everyone else)");
    cmd->add_option("--shares", o.shares, "account shares, e.g. research=2,prod=1 (default 1)");
    cmd->add_option("--bf-window", o.bf_window_min,
                    "backfill: reservations only this many minutes ahead (default 1440, or "
                    "slurm.conf's bf_window)")
        ->check(CLI::Range(1e-6, 1e9));
    cmd->add_option("--jobs-out", o.jobs_out, "per-job results: .csv or .json");
    cmd->add_flag("--json", o.json, "print one JSON object");
}

}  // namespace

void add_sim_cluster(CLI::App* sim) {
    auto* cmd = sim->add_subcommand("cluster", "run a job trace under scheduling policies");
    static Options o;
    add_trace_options(cmd, o);
    cmd->add_option("--policies", o.policies,
                    "comma-separated: fifo, backfill, priority, twolevel, multifactor, "
                    "multifactor-fifo, wfp, each with optional +preempt, +carbon (default "
                    "fifo,backfill,twolevel; Slurm's with --slurm-conf)");
    cmd->add_option("--spot-profile", o.spot_profile,
                    "CSV hour,spot_nodes[,spot_price]: spot capacity and USD per device-hour");
    cmd->add_option("--carbon-profile", o.carbon_profile,
                    "CSV hour,gco2_per_kwh (or one value per line, hourly); default "
                    "cluster.carbon_profile or cluster.gco2_per_kwh");
    cmd->add_option("--capacity-out", o.capacity_out,
                    "CSV time,available_nodes of the capacity timeline used");
    cmd->add_flag("--failures", o.failures, "nodes fail at cluster.mtbf_node_hours");
    cmd->add_option("--repair-hours", o.repair_h, "a failed node is back after this")
        ->check(CLI::Range(0.0, 1e6));
    cmd->add_option("--priority-weights", o.priority_weights,
                    "multifactor: age=W,size=W,fairshare=W (default 1000 each, or slurm.conf's "
                    "PriorityWeightAge/JobSize/Fairshare)");
    cmd->add_option("--priority-max-age-days", o.max_age_days,
                    "multifactor: the age factor reaches 1 at this age (default 7, or "
                    "slurm.conf's PriorityMaxAge)")
        ->check(CLI::Range(0.0, 1e6));
    cmd->add_option("--nodes-per-leaf", o.nodes_per_leaf,
                    "nodes under one leaf switch (consecutive nodes): a job of whole nodes goes "
                    "inside one leaf when one has room (0: no placement, the default)")
        ->check(CLI::Range(0, 100000000));
    cmd->add_option("--bf-min-age-reserve-hours", o.bf_min_age_reserve_h,
                    "backfill: a job gets a reservation only once it has waited this long (0, "
                    "the default, or slurm.conf's bf_min_age_reserve)")
        ->check(CLI::Range(0.0, 1e6));
    cmd->add_option("--bf-max-job-user", o.bf_max_job_user,
                    "backfill: jobs of one user tested per pass (0: no limit, the default; or "
                    "slurm.conf's bf_max_job_user)")
        ->check(CLI::Range(0, 100000000));
    cmd->add_option("--user-max-jobs", o.user_max_jobs,
                    "every user runs at most this many jobs at once (a --limits line "
                    "user,*,N,; sim fit searches it)")
        ->check(CLI::Range(0LL, 1000000000LL));
    cmd->add_flag("--priority-favor-small", o.favor_small,
                  "multifactor: smaller jobs get the larger job-size factor (slurm.conf "
                  "PriorityFavorSmall=YES)");
    cmd->add_option("--bf-max-job-test", o.bf_max_job_test,
                    "backfill: jobs that get a reservation when they cannot start (1: EASY, the "
                    "default; more: Slurm's sched/backfill, which reserves for every job it "
                    "tests)")
        ->check(CLI::Range(1, 100000000));
    cmd->add_option("--checkpoint-interval-s", o.ckpt_interval_s,
                    "checkpoint interval of jobs without a model (0: continuous)")
        ->check(CLI::Range(0.0, 1e9));
    cmd->add_option("--horizon-days", o.horizon_days, "stop after this (0: when all jobs end)")
        ->check(CLI::Range(0.0, 1e6));
    cmd->add_option("--seed", o.seed, "seed of the failure times");
    cmd->add_option("--warmup-fraction", o.warmup_fraction,
                    "a replay compares the waits of jobs submitted after this fraction of the "
                    "log's span (the rest warm the queue up; default 0)")
        ->check(CLI::Range(0.0, 1.0));
    cmd->add_option("--series-out", o.series_out,
                    "CSV of the cluster over time: busy and available devices, queued jobs");
    cmd->add_option("--svg", o.svg, "picture: .svg, or .png through rsvg-convert");
    cmd->callback([] { run(o); });
}

void add_sim_fit(CLI::App* sim) {
    auto* cmd = sim->add_subcommand(
        "fit",
        "fit a policy's free parameters to the first part of a recorded log, report on the rest");
    static Options o;
    add_trace_options(cmd, o);
    cmd->add_option("--policies", o.policies,
                    "the policies searched, comma-separated: fifo, backfill, multifactor, "
                    "multifactor-fifo, wfp (default fifo,backfill,multifactor,wfp)");
    cmd->add_option("--fit-fraction", o.fit_fraction,
                    "the first part of the log's span that the search sees (default 0.5); the "
                    "report covers the jobs submitted after it")
        ->check(CLI::Range(0.05, 0.95));
    cmd->callback([] { run_fit(o); });
}

}  // namespace apiary::cli
