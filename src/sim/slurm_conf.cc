// The scheduling part of slurm.conf: SchedulerType, SchedulerParameters'
// bf_max_job_test, and the NodeName lines (how many nodes, CPUs and GPUs).
// Everything else in the file is Slurm's business and is skipped.

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "core/error.h"
#include "sim/slurm.h"
#include "sim/text.h"

namespace apiary::sim {

namespace {

std::string lower(std::string s) {
    std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
    return s;
}

// "Key=Value Key2=Value2" -> {key: value} with lower-case keys.
std::map<std::string, std::string> pairs(const std::string& line) {
    std::map<std::string, std::string> m;
    for (const auto& word : split(line, ' ')) {
        const auto w = trim(word);
        const auto eq = w.find('=');
        if (eq == std::string::npos) continue;
        m[lower(w.substr(0, eq))] = w.substr(eq + 1);
    }
    return m;
}

long long num(const std::map<std::string, std::string>& m, const char* key, long long def) {
    auto it = m.find(key);
    return it == m.end() ? def : std::atoll(it->second.c_str());
}

// Gres=gpu:8 or gpu:a100:8 (or several, comma-separated).
long long gres_gpus(const std::string& gres) {
    long long n = 0;
    for (const auto& g : split(gres, ',')) {
        const auto parts = split(g, ':');
        if (parts.size() >= 2 && parts[0] == "gpu") n += std::atoll(parts.back().c_str());
    }
    return n;
}

}  // namespace

namespace {

// PriorityWeight*: a whole number >= 0 (Slurm takes 32-bit unsigned).
double weight(const std::string& v, const std::string& where, const char* key) {
    double x = 0;
    if (!parse_double(v, &x) || x < 0 || x != std::floor(x) || x > 4294967295.0) {
        throw ConfigError(
            fmt::format("{}: {}={} is not a whole number 0-4294967295", where, key, printable(v)));
    }
    return x;
}

}  // namespace

SlurmConf parse_slurm_conf(const std::string& text, const std::string& source, bool need_nodes) {
    SlurmConf c;
    std::map<std::string, std::string> defaults;  // NodeName=DEFAULT
    int line_no = 0;
    for (std::string line : split_lines(text)) {
        ++line_no;
        if (const auto hash = line.find('#'); hash != std::string::npos) line.resize(hash);
        line = trim(line);
        if (line.empty()) continue;
        const std::string where = fmt::format("{}:{}", source, line_no);
        auto m = pairs(line);
        if (m.count("schedulertype")) c.scheduler = m["schedulertype"];
        if (m.count("prioritytype")) c.priority_type = m["prioritytype"];
        if (m.count("priorityweightage")) {
            c.weight_age = weight(m["priorityweightage"], where, "PriorityWeightAge");
        }
        if (m.count("priorityweightjobsize")) {
            c.weight_size = weight(m["priorityweightjobsize"], where, "PriorityWeightJobSize");
        }
        if (m.count("priorityweightfairshare")) {
            c.weight_fairshare =
                weight(m["priorityweightfairshare"], where, "PriorityWeightFairshare");
        }
        if (m.count("prioritymaxage")) {
            c.priority_max_age_s =
                parse_slurm_duration(m["prioritymaxage"], where + ": PriorityMaxAge");
        }
        if (m.count("priorityfavorsmall")) {
            const std::string v = lower(m["priorityfavorsmall"]);
            if (v != "yes" && v != "no") {
                throw ConfigError(fmt::format("{}: PriorityFavorSmall={} is not YES or NO", where,
                                              printable(m["priorityfavorsmall"])));
            }
            c.favor_small = v == "yes";
        }
        if (m.count("prioritycalcperiod")) {
            c.calc_period_s =
                parse_slurm_duration(m["prioritycalcperiod"], where + ": PriorityCalcPeriod");
        }
        if (m.count("prioritydecayhalflife")) {
            c.decay_half_life_s =
                parse_slurm_duration(m["prioritydecayhalflife"], where + ": PriorityDecayHalfLife");
        }
        if (m.count("schedulerparameters")) {
            for (const auto& p : split(m["schedulerparameters"], ',')) {
                if (p.rfind("bf_max_job_test=", 0) == 0)
                    c.bf_max_job_test = std::atoll(p.c_str() + 16);
                if (p.rfind("bf_max_job_user=", 0) == 0)
                    c.bf_max_job_user = std::atoll(p.c_str() + 16);
                if (p.rfind("bf_window=", 0) == 0) {
                    double m = 0;
                    if (!parse_double(p.substr(10), &m) || m <= 0) {
                        throw ConfigError(
                            fmt::format("{}: SchedulerParameters bf_window={} is not minutes > 0",
                                        where, printable(p.substr(10))));
                    }
                    c.bf_window_s = m * 60;
                }
            }
        }
        if (!m.count("nodename")) continue;
        if (lower(m["nodename"]) == "default") {
            for (const auto& [k, v] : m) defaults[k] = v;
            continue;
        }
        for (const auto& [k, v] : defaults) m.emplace(k, v);
        long long cpus = num(m, "cpus", 0);
        if (cpus == 0) {  // CPUs unset: sockets x cores x threads, Slurm's own rule
            cpus = num(m, "sockets", 1) * num(m, "corespersocket", 1) * num(m, "threadspercore", 1);
        }
        const long long gpus = m.count("gres") ? gres_gpus(m["gres"]) : 0;
        const long long n = hostlist_count(m["nodename"], where);
        if (c.nodes > 0 && (cpus != c.cpus_per_node || gpus != c.gpus_per_node)) {
            throw ConfigError(fmt::format(
                "{}: nodes with {} CPUs and {} GPUs after nodes with {} and {}: the simulator "
                "needs nodes of one size (simulate each partition on its own)",
                where, cpus, gpus, c.cpus_per_node, c.gpus_per_node));
        }
        c.nodes += n;
        c.cpus_per_node = cpus;
        c.gpus_per_node = gpus;
    }
    if (c.nodes == 0 && need_nodes) {
        throw ConfigError(
            fmt::format("{}: no NodeName lines: which nodes does Slurm have?", source));
    }
    if (c.scheduler != "sched/backfill" && c.scheduler != "sched/builtin") {
        throw ConfigError(fmt::format(
            "{}: SchedulerType={} is not one the simulator models (sched/backfill, sched/builtin)",
            source, c.scheduler));
    }
    if (c.priority_type != "priority/basic" && c.priority_type != "priority/multifactor") {
        throw ConfigError(
            fmt::format("{}: PriorityType={} is not one the simulator models (priority/basic, "
                        "priority/multifactor)",
                        source, c.priority_type));
    }
    return c;
}

SlurmConf read_slurm_conf(const std::string& path, bool need_nodes) {
    SlurmConf c;
    with_printable_errors(
        [&] { c = parse_slurm_conf(read_text_file(path, "slurm.conf"), path, need_nodes); });
    return c;
}

}  // namespace apiary::sim
