// `apiary sim comm`: collectives of several jobs on one fabric, each
// placement policy in turn: each job's time alone and with the others, and
// the planner's alpha-beta time for comparison.

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "cli/sim_cmd.h"
#include "core/error.h"
#include "plan/planner.h"
#include "sim/collective.h"
#include "sim/pictures.h"
#include "sim/svg.h"
#include "sim/text.h"

namespace apiary::cli {

namespace {

struct JobArg {
    std::string text;
    long long ranks = 0;
    sim::Op op = sim::Op::all_reduce;
    double bytes = 0;
    plan::Algo algo = plan::Algo::automatic;
};

double parse_bytes(const std::string& s, const std::string& job) {
    static const std::pair<const char*, double> units[] = {{"KiB", 1024.0},
                                                           {"MiB", 1048576.0},
                                                           {"GiB", 1073741824.0},
                                                           {"TiB", 1099511627776.0},
                                                           {"K", 1e3},
                                                           {"M", 1e6},
                                                           {"G", 1e9},
                                                           {"T", 1e12},
                                                           {"B", 1}};
    for (const auto& [u, mult] : units) {
        const std::string unit = u;
        if (s.size() > unit.size() && s.ends_with(unit)) {
            double v = 0;
            if (sim::parse_double(s.substr(0, s.size() - unit.size()), &v) && v > 0)
                return v * mult;
        }
    }
    double v = 0;
    if (sim::parse_double(s, &v) && v > 0) return v;
    throw ConfigError(
        fmt::format("--job {}: '{}' is not a size in bytes (e.g. 1GiB, 64MiB, 256e6)", job, s));
}

JobArg parse_job(const std::string& text) {
    const auto parts = sim::split(text, ':');
    if (parts.size() < 3 || parts.size() > 4) {
        throw ConfigError(fmt::format(
            "--job {}: expected RANKS:OP:BYTES[:ALGO], e.g. 64:all-reduce:1GiB:ring", text));
    }
    JobArg j;
    j.text = text;
    double r = 0;
    if (!sim::parse_double(parts[0], &r) || r < 1 || r != std::floor(r)) {
        throw ConfigError(
            fmt::format("--job {}: ranks '{}' is not a whole number >= 1", text, parts[0]));
    }
    j.ranks = (long long)r;
    try {
        j.op = sim::parse_op(parts[1]);
        if (parts.size() == 4) j.algo = plan::parse_algo(parts[3]);
    } catch (const ConfigError& e) {
        throw ConfigError(fmt::format("--job {}: {}", text, e.what()));
    }
    j.bytes = parse_bytes(parts[2], text);
    return j;
}

struct Row {  // one job under one placement
    std::string placement;
    long long nodes = 0;
    plan::Algo algo = plan::Algo::ring;
    double alone = 0, shared = 0, planner = 0;
    std::string note;
};

std::vector<sim::Step> repeat(const std::vector<sim::Step>& s, int times) {
    if (times == 1) return s;
    std::vector<sim::Step> out;
    for (int i = 0; i < times; ++i) out.insert(out.end(), s.begin(), s.end());
    return out;
}

std::string fmt_s(double s) {
    if (s < 1e-3) return fmt::format("{:.4g} us", s * 1e6);
    if (s < 1) return fmt::format("{:.4g} ms", s * 1e3);
    return fmt::format("{:.4g} s", s);
}

struct CommOptions {
    SimClusterOptions cluster;
    std::vector<std::string> jobs;
    std::string placements = "packed,spread,random,topology", svg;
    int iterations = 1;
    uint64_t seed = 1;
    bool json = false;
};

// Every job under one placement: alone on the fabric, then all at once.
std::vector<Row> run_placement(const sim::Fabric& fabric, const plan::Cluster& c,
                               const std::vector<JobArg>& jobs, const std::string& pname,
                               const CommOptions& o) {
    std::vector<long long> sizes;
    for (const auto& j : jobs) sizes.push_back(j.ranks);
    const auto devs = sim::place(fabric, sizes, sim::parse_placement(pname), o.seed);
    std::vector<std::vector<sim::Step>> steps;
    std::vector<Row> r(jobs.size());
    for (size_t i = 0; i < jobs.size(); ++i) {
        steps.push_back(repeat(sim::collective_steps(fabric, devs[i], jobs[i].op, jobs[i].algo,
                                                     jobs[i].bytes, &r[i].note),
                               o.iterations));
        std::set<int> nodes;
        for (long long d : devs[i]) nodes.insert(fabric.node_of(d));
        r[i].placement = pname;
        r[i].nodes = (long long)nodes.size();
        r[i].algo = jobs[i].algo;
        r[i].planner = sim::alpha_beta_s(c, jobs[i].ranks, jobs[i].op, jobs[i].algo, jobs[i].bytes);
        r[i].alone = sim::simulate_flows(fabric, {steps[i]}).finish_s[0] / o.iterations;
    }
    const sim::FlowStats all = sim::simulate_flows(fabric, steps);
    for (size_t i = 0; i < jobs.size(); ++i) r[i].shared = all.finish_s[i] / o.iterations;
    if (!r.empty()) {
        r[0].note += (r[0].note.empty() ? "" : "; ") +
                     fmt::format("busiest link: {} ({:.0f}% used on average)", all.hottest_link,
                                 100 * all.hottest_link_util);
        if (!all.hottest_switch.empty()) {
            r[0].note += fmt::format("; busiest switch link: {} ({:.0f}% at its peak)",
                                     all.hottest_switch, 100 * all.hottest_switch_peak);
        }
    }
    return r;
}

// An all-to-all has no algorithm to choose: every rank sends to every
// other at once.
std::string algo_label(sim::Op op, plan::Algo algo) {
    return op == sim::Op::all_to_all ? "direct" : plan::algo_name(algo);
}

std::string job_label(const JobArg& j) {
    return fmt::format("{} {} on {} ({})", sim::op_name(j.op), sim::byte_size(j.bytes), j.ranks,
                       algo_label(j.op, j.algo));
}

void print_rows(const plan::Cluster& c, const sim::Fabric& fabric, const std::vector<JobArg>& jobs,
                const std::vector<std::vector<Row>>& rows) {
    fmt::print("fabric: {} x {} ({} per node), {} (NIC {:.4g} GB/s, intra-node {:.4g} GB/s)\n", c.n,
               c.dev.name, c.ranks_per_node(), c.topo.name, fabric.nic_bw() / 1e9,
               fabric.intra_bw() / 1e9);
    fmt::print("\n{:<10} {:<31} {:<13} {:>6} {:>12} {:>12} {:>9} {:>12} {:>9}\n", "placement",
               "job", "algorithm", "nodes", "alone", "shared", "slowdown", "alpha-beta", "vs a-b");
    for (const auto& r : rows) {
        for (size_t i = 0; i < r.size(); ++i) {
            fmt::print("{:<10} {:<31} {:<13} {:>6} {:>12} {:>12} {:>8.2f}x {:>12} {:>8.3f}x\n",
                       r[i].placement, jobs[i].text, algo_label(jobs[i].op, r[i].algo), r[i].nodes,
                       fmt_s(r[i].alone), fmt_s(r[i].shared), r[i].shared / r[i].alone,
                       fmt_s(r[i].planner), r[i].shared / r[i].planner);
        }
        for (const auto& x : r) {
            if (!x.note.empty()) fmt::print("  {}: {}\n", x.placement, x.note);
        }
    }
}

nlohmann::json rows_json(const plan::Cluster& c, const std::vector<JobArg>& jobs,
                         const std::vector<std::vector<Row>>& rows) {
    nlohmann::json out;
    out["cluster"] = {{"device", c.dev.name},
                      {"devices", c.n},
                      {"devices_per_node", c.ranks_per_node()},
                      {"topology", c.topo.name}};
    out["results"] = nlohmann::json::array();
    for (const auto& r : rows) {
        for (size_t i = 0; i < r.size(); ++i) {
            out["results"].push_back({{"placement", r[i].placement},
                                      {"job", jobs[i].text},
                                      {"algo", algo_label(jobs[i].op, r[i].algo)},
                                      {"nodes", r[i].nodes},
                                      {"alone_s", r[i].alone},
                                      {"shared_s", r[i].shared},
                                      {"alpha_beta_s", r[i].planner},
                                      {"note", r[i].note}});
        }
    }
    return out;
}

void run_comm(const CommOptions& o) {
    core::Config cfg = resolve_sim_config(o.cluster);
    std::vector<JobArg> jobs;
    long long need = 0;
    for (const auto& t : o.jobs) {
        jobs.push_back(parse_job(t));
        need += jobs.back().ranks;
    }
    if (cfg.get_int("cluster.gpus") <= 0) cfg.set_value("cluster.gpus", int64_t(need), "--job");
    const plan::Cluster c = plan::cluster_from(cfg, cfg.get_int("cluster.gpus"));
    const sim::Fabric fabric(c);
    for (auto& j : jobs) {
        if (j.algo == plan::Algo::automatic) j.algo = sim::choose_algo(c, j.ranks, j.op, j.bytes);
    }
    std::vector<std::vector<Row>> rows;  // [placement][job]
    sim::CommBars bars;
    for (const auto& pname : sim::split(o.placements, ',')) {
        rows.push_back(run_placement(fabric, c, jobs, pname, o));
        bars.placements.push_back(pname);
        bars.shared_s.emplace_back();
        bars.alone_s.emplace_back();
        for (const auto& x : rows.back()) {
            bars.shared_s.back().push_back(x.shared);
            bars.alone_s.back().push_back(x.alone);
        }
    }
    for (const auto& j : jobs) {
        bars.jobs.push_back(job_label(j));
        bars.planner_s.push_back(sim::alpha_beta_s(c, j.ranks, j.op, j.algo, j.bytes));
    }
    if (!o.svg.empty()) {
        const std::string title =
            fmt::format("{} jobs on {} x {}, {}", jobs.size(), c.n, c.dev.name, c.topo.name);
        sim::write_picture(sim::comm_svg(bars, title), o.svg);
    }
    if (o.json) {
        fmt::print("{}\n", rows_json(c, jobs, rows).dump(2));
    } else {
        print_rows(c, fabric, jobs, rows);
    }
}

}  // namespace

void add_sim_comm(CLI::App* sim) {
    auto* cmd = sim->add_subcommand("comm", "simulate collectives of several jobs on one fabric");
    static CommOptions o;
    add_sim_cluster_options(cmd, o.cluster);
    cmd->add_option("--job", o.jobs,
                    "RANKS:OP:BYTES[:ALGO] (repeatable): OP all-reduce, reduce-scatter, "
                    "all-gather, all-to-all; ALGO auto, ring, tree, hierarchical")
        ->required();
    cmd->add_option("--placements", o.placements,
                    "packed, spread, random, topology (comma list; default all four)");
    cmd->add_option("--iterations", o.iterations, "collectives each job runs back to back")
        ->check(CLI::Range(1, 100000));
    cmd->add_option("--seed", o.seed, "seed of the random placement");
    cmd->add_option("--svg", o.svg, "picture: .svg, or .png through rsvg-convert");
    cmd->add_flag("--json", o.json, "print one JSON object");
    cmd->callback([] { run_comm(o); });
}

}  // namespace apiary::cli
