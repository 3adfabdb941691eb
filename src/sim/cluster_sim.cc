#include "sim/cluster_sim.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"
#include "sim/text.h"

namespace apiary::sim {

Policy parse_policy(const std::string& name) {
    Policy p;
    p.name = name;
    const auto parts = split(name, '+');
    const std::string& base = parts[0];
    if (base == "fifo") {
        p.order = Order::submit;
    } else if (base == "backfill") {
        p.order = Order::submit, p.backfill = true;
    } else if (base == "priority") {
        p.order = Order::priority, p.backfill = true;
    } else if (base == "twolevel") {
        p.order = Order::fairshare, p.backfill = true;
    } else if (base == "multifactor") {
        p.order = Order::multifactor, p.backfill = true;
    } else if (base == "multifactor-fifo") {
        p.order = Order::multifactor;
    } else if (base == "wfp") {
        p.order = Order::multifactor, p.backfill = true, p.wfp = true;
    } else {
        throw ConfigError(fmt::format(
            "--policies: unknown policy '{}' (known: fifo, backfill, priority, twolevel, "
            "multifactor, multifactor-fifo, wfp; each may add +preempt and +carbon, e.g. "
            "twolevel+preempt)",
            base));
    }
    for (size_t i = 1; i < parts.size(); ++i) {
        if (parts[i] == "preempt") {
            p.preempt = true;
        } else if (parts[i] == "carbon") {
            p.carbon = true;
        } else {
            throw ConfigError(
                fmt::format("--policies: unknown modifier '+{}' in '{}' (known: +preempt, +carbon)",
                            parts[i], name));
        }
    }
    return p;
}

Limits parse_limits(const std::string& text, const std::string& source) {
    Limits l;
    std::vector<std::string> header;
    for_each_csv_row(text, source, [&](std::vector<std::string>& cells, const std::string& where) {
        if (header.empty()) {
            header = cells;
            if (fmt::format("{}", fmt::join(header, ",")) !=
                "kind,name,max_running_jobs,max_nodes") {
                throw DataError(
                    fmt::format("{}: header '{}' is not kind,name,max_running_jobs,max_nodes",
                                where, printable(fmt::format("{}", fmt::join(header, ",")))));
            }
            return;
        }
        if (cells.size() != 4) {
            throw DataError(
                fmt::format("{}: {} cells but the header has 4 fields", where, cells.size()));
        }
        if (cells[0] != "user" && cells[0] != "account") {
            throw DataError(
                cell_message(Cell{printable(cells[0]), where, "kind"}, "is not user or account"));
        }
        if (cells[1].empty()) {
            throw DataError(
                fmt::format("{}: field 'name' is empty (a name, or * for everyone)", where));
        }
        Limit x;
        if (!cells[2].empty()) {
            x.max_jobs = (long long)cell_integer(Cell{cells[2], where, header[2]}, 0, 1e9,
                                                 "a whole number >= 0, or empty for none");
        }
        if (!cells[3].empty()) {
            x.max_nodes = (long long)cell_integer(Cell{cells[3], where, header[3]}, 0, 1e9,
                                                  "a whole number >= 0, or empty for none");
        }
        auto& m = cells[0] == "user" ? l.user : l.account;
        if (!m.emplace(cells[1], x).second) {
            throw DataError(fmt::format("{}: {} '{}' has a limit already", where, cells[0],
                                        printable(cells[1])));
        }
    });
    if (header.empty()) throw DataError(fmt::format("{}: no header line", source));
    return l;
}

Limits read_limits(const std::string& path) {
    Limits l;
    with_printable_errors([&] { l = parse_limits(read_text_file(path, "--limits"), path); });
    return l;
}

const char* job_state_name(JobState s) {
    switch (s) {
        case JobState::rejected:
            return "rejected";
        case JobState::completed:
            return "completed";
        case JobState::timeout:
            return "timeout";
        case JobState::unfinished:
            return "unfinished";
    }
    return "?";
}

namespace {

std::string capacity_problem(const JobSpec& s, const SimConfig& cfg) {
    if (s.spot) {
        const long long spot = (long long)cfg.spot_nodes_max * cfg.per_node;
        if (spot == 0) {
            return "a spot job, but the cluster has no spot capacity (give --spot-profile)";
        }
        if (s.devices > spot) {
            return fmt::format("needs {} devices but spot capacity peaks at {} ({} nodes x {})",
                               s.devices, spot, cfg.spot_nodes_max, cfg.per_node);
        }
        return "";
    }
    if (s.devices > cfg.devices()) {
        return fmt::format("needs {} devices but the cluster has {} ({} nodes x {})", s.devices,
                           cfg.devices(), cfg.nodes, cfg.per_node);
    }
    return "";
}

}  // namespace

std::vector<SimJob> prepare_jobs(const Trace& trace, JobModel& model, const SimConfig& cfg) {
    std::vector<SimJob> out;
    out.reserve(trace.jobs.size());
    for (const auto& spec : trace.jobs) {
        SimJob j;
        j.spec = spec;
        j.reject = spec.reject;
        if (j.reject.empty()) j.reject = capacity_problem(spec, cfg);
        if (j.reject.empty()) {
            j.cost = model.cost(spec);
            j.reject = j.cost.reject;
        }
        out.push_back(std::move(j));
    }
    return out;
}

}  // namespace apiary::sim
