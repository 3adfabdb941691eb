#include "sim/capacity.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <ostream>
#include <set>

#include "core/error.h"
#include "sim/slurm.h"
#include "sim/text.h"

namespace apiary::sim {

namespace {

// "nid[0010-0012,0020],login1" -> nid0010 nid0011 nid0012 nid0020 login1
// (one bracket group a name; zero padding kept).
std::vector<std::string> expand_hostlist(const std::string& list, const Cell& c) {
    std::vector<std::string> out;
    std::vector<std::string> names;
    std::string cur;
    int depth = 0;
    for (char ch : list) {
        if (ch == '[') ++depth;
        if (ch == ']') --depth;
        if (ch == ',' && depth == 0) {
            names.push_back(cur);
            cur.clear();
        } else {
            cur += ch;
        }
    }
    names.push_back(cur);
    for (const auto& name : names) {
        const size_t open = name.find('[');
        if (name.empty()) throw DataError(cell_message(c, "has an empty node name"));
        if (open == std::string::npos) {
            out.push_back(name);
            continue;
        }
        const size_t close = name.find(']', open);
        if (close == std::string::npos || name.find('[', open + 1) != std::string::npos) {
            throw DataError(
                cell_message(c, "is not a hostlist this reader knows (one [a-b,c] group a name)"));
        }
        const std::string pre = name.substr(0, open), post = name.substr(close + 1);
        for (const auto& r : split(name.substr(open + 1, close - open - 1), ',')) {
            const auto dash = r.find('-');
            const std::string a = r.substr(0, dash);
            const std::string b = dash == std::string::npos ? a : r.substr(dash + 1);
            double x = 0, y = 0;
            if (!parse_double(a, &x) || !parse_double(b, &y) || x < 0 || y < x ||
                x != std::floor(x) || y != std::floor(y) || y - x > 1e6) {
                throw DataError(cell_message(c, fmt::format("has a bad range '{}'", r)));
            }
            for (long long i = (long long)x; i <= (long long)y; ++i) {
                out.push_back(fmt::format("{}{:0{}}{}", pre, i, a.size(), post));
            }
        }
    }
    return out;
}

}  // namespace

namespace {

void parse_sacctmgr_events(const std::vector<std::string>& lines, size_t first,
                           const std::string& source, CapacityInput& in, double origin) {
    const auto header = split(trim(lines[first]), '|');
    auto col = [&](const char* name) -> size_t {
        for (size_t i = 0; i < header.size(); ++i) {
            if (header[i] == name) return i;
        }
        throw DataError(
            fmt::format("{}:{}: sacctmgr events without a '{}' field (give "
                        "format=NodeName,TimeStart,TimeEnd,State)",
                        source, first + 1, name));
    };
    const size_t cn = col("NodeName"), cs = col("TimeStart"), ce = col("TimeEnd"),
                 cst = col("State");
    auto missing = [](const std::string& v) {
        return v.empty() || v == "Unknown" || v == "None" || v == "N/A";
    };
    for (size_t i = first + 1; i < lines.size(); ++i) {
        const std::string line = trim(lines[i]);
        if (line.empty()) continue;
        const std::string where = fmt::format("{}:{}", source, i + 1);
        auto cells = split(line, '|');
        if (cells.size() == header.size() + 1 && cells.back().empty()) cells.pop_back();
        if (cells.size() != header.size()) {
            throw DataError(fmt::format("{}: {} fields but the header has {}", where, cells.size(),
                                        header.size()));
        }
        if (trim(cells[cn]).empty()) continue;  // a cluster event, no nodes
        const auto nodes = expand_hostlist(trim(cells[cn]), Cell{cells[cn], where, "NodeName"});
        const double t0 = std::max(
            0.0, parse_slurm_time(trim(cells[cs]), where + ": field 'TimeStart'") - origin);
        const bool down = cells[cst].find("DOWN") != std::string::npos;
        in.events.push_back({t0, down ? 1 : 0, nodes, where});
        if (!missing(trim(cells[ce]))) {
            const double t1 =
                parse_slurm_time(trim(cells[ce]), where + ": field 'TimeEnd'") - origin;
            if (t1 < t0) {
                throw DataError(fmt::format("{}: field 'TimeEnd' {} is before TimeStart {}", where,
                                            printable(cells[ce]), printable(cells[cs])));
            }
            in.events.push_back({std::max(0.0, t1), 2, nodes, where});
        }
    }
}

}  // namespace

void parse_capacity_csv(const std::string& text, const std::string& source, CapacityInput& in,
                        double origin_epoch) {
    const auto all = split_lines(text);
    for (size_t i = 0; i < all.size(); ++i) {
        if (is_blank_or_comment(all[i])) continue;
        if (all[i].find('|') != std::string::npos && all[i].find("NodeName") != std::string::npos) {
            parse_sacctmgr_events(all, i, source, in, origin_epoch);
            return;
        }
        break;
    }
    std::vector<std::string> header;
    int kind = -1;  // 0 levels, 1 events, 2 reservations
    double last_t = -1;
    for_each_csv_row(text, source, [&](std::vector<std::string>& cells, const std::string& where) {
        if (header.empty()) {
            header = cells;
            const std::string h = fmt::format("{}", fmt::join(header, ","));
            if (h == "time,available_nodes") {
                kind = 0;
            } else if (h == "time,event,nodes") {
                kind = 1;
            } else if (h == "start,end,nodes") {
                kind = 2;
            } else {
                throw DataError(fmt::format(
                    "{}: header '{}' is not one of time,available_nodes / time,event,nodes / "
                    "start,end,nodes",
                    where, printable(h)));
            }
            return;
        }
        if (cells.size() != header.size()) {
            throw DataError(fmt::format("{}: {} cells but the header has {} fields ({})", where,
                                        cells.size(), header.size(), fmt::join(header, ",")));
        }
        auto cell = [&](size_t i) { return Cell{cells[i], where, header[i]}; };
        if (kind == 0 || kind == 1) {
            const double t = cell_number(cell(0), 0, 1e15, "seconds from the trace's start");
            if (t < last_t) {
                throw DataError(cell_message(cell(0), fmt::format("is before the previous row's "
                                                                  "time {} (rows in time order)",
                                                                  last_t)));
            }
            last_t = t;
            if (kind == 0) {
                in.levels.push_back(
                    {t, (long long)cell_integer(cell(1), 0, 1e9, "a whole number >= 0")});
            } else {
                const std::string& e = cells[1];
                const int k = e == "drain" ? 0 : e == "down" ? 1 : e == "resume" ? 2 : -1;
                if (k < 0) {
                    throw DataError(cell_message(Cell{printable(e), where, header[1]},
                                                 "is not drain, down or resume"));
                }
                in.events.push_back({t, k, expand_hostlist(cells[2], cell(2)), where});
            }
        } else {
            const double s = cell_number(cell(0), 0, 1e15, "seconds from the trace's start");
            const double e = cell_number(cell(1), 0, 1e15, "seconds from the trace's start");
            if (e <= s) {
                throw DataError(cell_message(cell(1), fmt::format("is not after start {}", s)));
            }
            in.reservations.push_back(
                {s, e, (long long)cell_integer(cell(2), 1, 1e9, "a whole number >= 1")});
        }
    });
    if (header.empty()) throw DataError(fmt::format("{}: no header line", source));
}

void read_capacity_csv(const std::string& path, CapacityInput& in, double origin_epoch) {
    with_printable_errors(
        [&] { parse_capacity_csv(read_text_file(path, "--capacity"), path, in, origin_epoch); });
}

std::vector<CapacityStep> capacity_timeline(const CapacityInput& input, long long nodes) {
    // Events in time order (files may interleave; a file keeps its order).
    CapacityInput in = input;
    std::stable_sort(in.events.begin(), in.events.end(),
                     [](const auto& a, const auto& b) { return a.t < b.t; });
    std::stable_sort(in.levels.begin(), in.levels.end(),
                     [](const auto& a, const auto& b) { return a.t < b.t; });
    // Every time something changes, in order; the state after all changes at
    // that time gives the step.
    std::vector<double> times = {0};
    for (const auto& l : in.levels) times.push_back(l.t);
    for (const auto& e : in.events) times.push_back(e.t);
    for (const auto& r : in.reservations) times.push_back(r.start), times.push_back(r.end);
    std::sort(times.begin(), times.end());
    times.erase(std::unique(times.begin(), times.end()), times.end());
    std::vector<CapacityStep> out;
    std::set<std::string> out_nodes;
    size_t li = 0, ei = 0;
    long long level = nodes;
    for (double t : times) {
        while (li < in.levels.size() && in.levels[li].t <= t) level = in.levels[li++].nodes;
        bool hard = false;
        while (ei < in.events.size() && in.events[ei].t <= t) {
            const auto& e = in.events[ei++];
            for (const auto& n : e.nodes) {
                if (e.kind == 2) {
                    out_nodes.erase(n);
                } else {
                    out_nodes.insert(n);
                }
            }
            hard |= e.kind == 1;
        }
        long long reserved = 0;
        for (const auto& r : in.reservations) reserved += r.start <= t && t < r.end ? r.nodes : 0;
        const long long avail =
            std::max(0LL, std::min(level, nodes) - (long long)out_nodes.size() - reserved);
        if (!out.empty() && out.back().nodes == avail && !hard) continue;
        out.push_back({t, avail, hard});
    }
    return out;
}

std::vector<CapacityStep> implied_capacity(const Trace& trace, long long nodes, double min_gap_s,
                                           int* outages) {
    // Sweep the record: +devices at a recorded start, -devices at its end;
    // the queue is the jobs submitted and not yet started.
    struct Ev {
        double t;
        int kind;  // 0 end, 1 submit, 2 start (ends first: their nodes are free)
        size_t j;
    };
    std::vector<Ev> ev;
    for (size_t j = 0; j < trace.jobs.size(); ++j) {
        const auto& s = trace.jobs[j];
        if (s.recorded_start < 0 || s.recorded_end < 0 || !s.reject.empty()) continue;
        ev.push_back({s.submit, 1, j});
        ev.push_back({s.recorded_start, 2, j});
        ev.push_back({s.recorded_end, 0, j});
    }
    std::sort(ev.begin(), ev.end(), [](const Ev& a, const Ev& b) {
        return a.t < b.t || (a.t == b.t && a.kind < b.kind);
    });
    std::multiset<long long> queued;  // sizes of queued jobs
    long long used = 0;
    // Candidate gap: since `fit_since` a queued job fits and nothing started.
    double fit_since = -1;
    std::vector<CapacityStep> out = {{0, nodes, false}};
    int found = 0;
    auto set = [&](double t, long long n) {
        n = std::clamp(n, 0LL, nodes);
        if (out.back().nodes == n) return;
        if (out.back().t == t) {
            out.back().nodes = n;
        } else {
            out.push_back({t, n, false});
        }
    };
    // Running totals within an outage, replayed once it is known to be one.
    std::vector<std::pair<double, long long>> gap_used;
    auto close_gap = [&](double t) {
        if (fit_since >= 0 && t - fit_since >= min_gap_s) {
            ++found;
            for (const auto& [gt, u] : gap_used) set(gt, u);
            set(t, nodes);
        }
        fit_since = -1;
        gap_used.clear();
    };
    for (size_t i = 0; i < ev.size();) {
        const double t = ev[i].t;
        bool started = false;
        for (; i < ev.size() && ev[i].t == t; ++i) {
            const long long d = trace.jobs[ev[i].j].devices;
            if (ev[i].kind == 0) {
                used -= d;
            } else if (ev[i].kind == 2) {
                used += d;
                started = true;
                queued.erase(queued.find(d));
            } else {
                queued.insert(d);
            }
        }
        const bool fits = !queued.empty() && *queued.begin() <= nodes - used;
        if (started || !fits) close_gap(t);
        if (fits && fit_since < 0) fit_since = t;  // nothing has started since t
        if (fit_since >= 0) gap_used.emplace_back(t, used);
    }
    if (outages) *outages = found;
    return out;
}

void write_capacity_csv(const std::vector<CapacityStep>& steps, std::ostream& out) {
    out << "time,available_nodes\n";
    for (const auto& s : steps) out << fmt::format("{},{}\n", s.t, s.nodes);
}

}  // namespace apiary::sim
