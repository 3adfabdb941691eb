// The cluster simulation drawn: a block per policy (Gantt chart of jobs on
// devices; utilisation and queue length over time on a shared time axis),
// then the policies' outcomes as bar charts side by side.

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "sim/pictures.h"
#include "sim/svg.h"

namespace apiary::sim {

namespace {

constexpr double kW = 1200, kLeft = 80, kRight = 70, kPlotW = kW - kLeft - kRight;
constexpr double kGanttH = 220, kUtilH = 90;

struct TimeAxis {
    double span;
    double x(double t) const { return kLeft + kPlotW * std::clamp(t / span, 0.0, 1.0); }
};

void time_ticks(Svg& s, const TimeAxis& ax, double y) {
    const auto [unit, div] = time_unit(ax.span);
    for (double v : nice_ticks(0, ax.span / div, 10)) {
        const double x = ax.x(v * div);
        s.line(x, y, x, y + 4, "#555");
        s.text(x, y + 16, fmt::format("{:g}", v), 11, "middle");
    }
    s.text(kLeft + kPlotW / 2, y + 30, fmt::format("time ({})", unit), 12, "middle");
}

// Runs of consecutive slots of one segment become one rectangle each.
void gantt(Svg& s, const SimResult& r, const SimConfig& cfg, const TimeAxis& ax, double y0) {
    const long long rows = (long long)(cfg.nodes + cfg.spot_nodes_max) * cfg.per_node;
    const double rh = kGanttH / double(std::max(1LL, rows));
    s.rect(kLeft, y0, kPlotW, kGanttH, "#f3f3f3");
    if (cfg.spot_nodes_max > 0) {
        const double ys = y0 + rh * double(cfg.devices());
        s.rect(kLeft, ys, kPlotW, kGanttH - (ys - y0), "#e6eef7");
        s.text(kLeft + kPlotW + 4, ys + 12, "spot", 11);
    }
    std::vector<int32_t> slots;
    for (const auto& seg : r.segments) {
        slots.assign(r.slots.begin() + seg.slot_begin,
                     r.slots.begin() + seg.slot_begin + seg.slot_count);
        std::sort(slots.begin(), slots.end());
        const double x0 = ax.x(seg.start), x1 = ax.x(seg.end);
        const bool cut = seg.end < r.jobs[size_t(seg.job)].end || r.jobs[size_t(seg.job)].end < 0;
        for (size_t i = 0; i < slots.size();) {
            size_t k = i + 1;
            while (k < slots.size() && slots[k] == slots[k - 1] + 1) ++k;
            const double y = y0 + rh * double(slots[i]);
            s.rect(x0, y, std::max(0.6, x1 - x0), rh * double(k - i), job_color(seg.job),
                   rh * double(k - i) > 3 ? "stroke=\"white\" stroke-width=\"0.3\"" : "");
            if (cut) s.rect(x1 - 1.2, y, 1.2, rh * double(k - i), "#d62728");
            i = k;
        }
    }
    for (double v : nice_ticks(0, double(rows), 5)) {
        const double y = y0 + rh * v;
        s.line(kLeft - 4, y, kLeft, y, "#555");
        s.text(kLeft - 6, y + 4, short_number(v), 10, "end");
    }
    s.text(18, y0 + kGanttH / 2, "devices", 12, "middle",
           fmt::format("transform=\"rotate(-90 18 {:.1f})\"", y0 + kGanttH / 2));
}

// Too many runs or devices for a Gantt chart: a heat map of the fraction of
// each group of nodes' devices that is busy, per column of time.
void heatmap(Svg& s, const SimResult& r, const SimConfig& cfg, const TimeAxis& ax, double y0) {
    const int nodes = cfg.nodes + cfg.spot_nodes_max;
    const int rows = std::min(nodes, 64), cols = 240;
    const int per_row = (nodes + rows - 1) / rows;
    const double colw = ax.span / cols;
    std::vector<double> busy(size_t(rows) * cols, 0);
    std::vector<int> count(size_t(rows), 0);
    for (const auto& seg : r.segments) {
        std::vector<int> touched;
        for (uint32_t i = 0; i < seg.slot_count; ++i) {
            const int row = r.slots[seg.slot_begin + i] / cfg.per_node / per_row;
            if (count[size_t(row)]++ == 0) touched.push_back(row);
        }
        const int c0 = std::min(cols - 1, int(seg.start / colw));
        const int c1 = std::min(cols - 1, int(seg.end / colw));
        for (int row : touched) {
            for (int c = c0; c <= c1; ++c) {
                const double o = std::min(seg.end, (c + 1) * colw) - std::max(seg.start, c * colw);
                if (o > 0) busy[size_t(row) * cols + size_t(c)] += count[size_t(row)] * o;
            }
            count[size_t(row)] = 0;
        }
    }
    const double rh = kGanttH / rows, cw = kPlotW / cols;
    const double cap = double(per_row) * cfg.per_node * colw;
    s.rect(kLeft, y0, kPlotW, kGanttH, "#f7f7f7");
    for (int row = 0; row < rows; ++row) {
        for (int c = 0; c < cols;) {  // merge runs of one shade into one rectangle
            const int level = int(std::round(5 * busy[size_t(row) * cols + size_t(c)] / cap));
            int e = c + 1;
            while (e < cols &&
                   int(std::round(5 * busy[size_t(row) * cols + size_t(e)] / cap)) == level) {
                ++e;
            }
            if (level > 0) {
                s.rect(kLeft + cw * c, y0 + rh * row, cw * (e - c), rh,
                       fmt::format("hsl(215,70%,{}%)", 90 - 11 * std::min(level, 5)));
            }
            c = e;
        }
    }
    s.text(kLeft + kPlotW + 4, y0 + 12, fmt::format("{} nodes", per_row), 10);
    s.text(kLeft + kPlotW + 4, y0 + 24, "per row", 10);
    s.text(18, y0 + kGanttH / 2, "nodes (busy share)", 12, "middle",
           fmt::format("transform=\"rotate(-90 18 {:.1f})\"", y0 + kGanttH / 2));
}

// Utilisation (busy / available, time-weighted per pixel column) and the
// longest queue in each column.
void utilisation(Svg& s, const SimResult& r, const TimeAxis& ax, double y0) {
    s.rect(kLeft, y0, kPlotW, kUtilH, "#fafafa", "stroke=\"#ccc\"");
    const int cols = int(kPlotW / 2);
    std::vector<double> busy(size_t(cols), 0), avail(size_t(cols), 0), queue(size_t(cols), 0);
    const double w = ax.span / cols;
    for (size_t i = 0; i < r.series.size(); ++i) {
        const auto& p = r.series[i];
        const double t1 = i + 1 < r.series.size() ? r.series[i + 1].t : ax.span;
        for (double t = p.t; t < t1 && t < ax.span;) {
            const int c = std::min(cols - 1, int(t / w));
            const double e = std::min(t1, (c + 1) * w);
            busy[size_t(c)] += double(p.busy) * (e - t);
            avail[size_t(c)] += double(p.available) * (e - t);
            queue[size_t(c)] = std::max(queue[size_t(c)], double(p.queued));
            if (e <= t) break;
            t = e;
        }
    }
    const double qmax = std::max(1.0, *std::max_element(queue.begin(), queue.end()));
    std::vector<std::pair<double, double>> u = {{kLeft, y0 + kUtilH}}, q;
    for (int c = 0; c < cols; ++c) {
        const double x = kLeft + kPlotW * (c + 0.5) / cols;
        const double f = avail[size_t(c)] > 0 ? busy[size_t(c)] / avail[size_t(c)] : 0;
        u.emplace_back(x, y0 + kUtilH * (1 - f));
        q.emplace_back(x, y0 + kUtilH * (1 - queue[size_t(c)] / qmax));
    }
    u.emplace_back(kLeft + kPlotW, y0 + kUtilH);
    s.polyline(u, "#1f77b4", 1, "rgba(31,119,180,0.25)");
    s.polyline(q, "#ff7f0e", 1.2);
    for (double v : {0.0, 0.5, 1.0}) {
        s.text(kLeft - 6, y0 + kUtilH * (1 - v) + 4, fmt::format("{:.0f}%", 100 * v), 10, "end");
    }
    s.text(kLeft + kPlotW + 6, y0 + 10, fmt::format("{}", short_number(qmax)), 10);
    s.text(kLeft + kPlotW + 6, y0 + kUtilH, "0", 10);
    s.text(kLeft + 6, y0 + 13, "utilisation", 11, "start", "fill=\"#1f77b4\"");
    s.text(kLeft + kPlotW - 6, y0 + 13, "jobs queued (right axis)", 11, "end", "fill=\"#ff7f0e\"");
}

// The unit for a set of durations: that of their median, so most bars
// read as short numbers.
std::pair<std::string, double> wait_unit(const std::vector<Summary>& sum) {
    std::vector<double> w;
    for (const auto& x : sum) w.push_back(std::max(1.0, x.mean_wait_s));
    return time_unit(percentile(w, 0.5));
}

// One bar chart per metric, one bar per policy; a metric whose values span
// more than 30x is drawn on a log scale (marked), so no bar vanishes.
void comparison(Svg& s, const std::vector<Summary>& sum, double y0) {
    const auto [wunit, wdiv] = wait_unit(sum);
    struct Metric {
        std::string name;
        double (*get)(const Summary&);
        double scale;
    };
    const std::vector<Metric> m = {
        {"mean wait (" + wunit + ")", [](const Summary& x) { return x.mean_wait_s; }, 1 / wdiv},
        {"p95 wait (" + wunit + ")", [](const Summary& x) { return x.p95_wait_s; }, 1 / wdiv},
        {"utilisation (%)", [](const Summary& x) { return x.utilisation; }, 100},
        {"cost ($)", [](const Summary& x) { return x.cost_usd; }, 1},
        {"CO2e (kg)", [](const Summary& x) { return x.co2_kg; }, 1},
    };
    s.text(kLeft, y0, "policies side by side", 15, "start", "font-weight=\"bold\"");
    double lx = kLeft + 220;
    for (size_t p = 0; p < sum.size(); ++p) {
        s.rect(lx, y0 - 10, 10, 10, series_color(int(p)));
        s.text(lx + 14, y0, sum[p].policy, 11);
        lx += 24 + 7.0 * double(sum[p].policy.size());
    }
    const double cw = kPlotW / double(m.size()), ch = 150, top = y0 + 56;
    for (size_t k = 0; k < m.size(); ++k) {
        const double x0 = kLeft + cw * double(k) + 10, w = cw - 30;
        double hi = 0, lo = 1e300;
        for (const auto& x : sum) {
            const double v = m[k].get(x) * m[k].scale;
            hi = std::max(hi, v);
            if (v > 0) lo = std::min(lo, v);
        }
        if (hi <= 0) hi = 1;
        const bool log = lo < 1e300 && hi / lo > 30;
        const double floor = log ? lo / 3 : 0;
        // The tallest bar takes 80% of the height: room for its label.
        auto height = [&](double v) {
            if (!log) return 0.8 * ch * v / hi;
            return v <= floor ? 0.0 : 0.8 * ch * std::log(v / floor) / std::log(hi / floor);
        };
        s.text(x0 + w / 2, top - 12, m[k].name + (log ? ", log scale" : ""), 12, "middle");
        s.line(x0, top + ch, x0 + w, top + ch, "#555");
        const double bw = w / double(sum.size());
        for (size_t p = 0; p < sum.size(); ++p) {
            const double v = m[k].get(sum[p]) * m[k].scale;
            const double h = height(v);
            s.rect(x0 + bw * double(p) + 2, top + ch - h, bw - 4, h, series_color(int(p)));
            const double lx2 = x0 + bw * (double(p) + 0.5), ly = top + ch - h - 3;
            // Narrow bars get their value written upwards, so neighbours do not collide.
            s.text(
                lx2, ly, short_number(v), 10, bw < 44 ? "start" : "middle",
                bw < 44 ? fmt::format("transform=\"rotate(-90 {:.1f} {:.1f})\"", lx2 + 3, ly) : "");
        }
    }
}

}  // namespace

std::string cluster_svg(const std::vector<SimResult>& results,
                        const std::vector<Summary>& summaries, const SimConfig& cfg,
                        const std::string& title) {
    const double block = 28 + kGanttH + 10 + kUtilH + 40;
    Svg s(kW, 56 + block * double(results.size()) + 290);
    s.text(kLeft, 26, title, 16, "start", "font-weight=\"bold\"");
    size_t most_runs = 0;
    for (const auto& r : results) most_runs = std::max(most_runs, r.segments.size());
    const long long devices = (long long)(cfg.nodes + cfg.spot_nodes_max) * cfg.per_node;
    const bool gantt_fits = most_runs <= kMaxGanttRects && devices <= kMaxGanttDevices;
    s.text(kLeft, 44,
           gantt_fits ? "each rectangle: a run of a job on its devices (one colour per job); a "
                        "red edge: a run cut by a failure, a preemption or a spot reclaim"
                      : "heat map: the share of each row's devices that is busy (darker: busier)",
           11, "start", "fill=\"#555\"");
    double span = 1;
    for (const auto& r : results) {
        span = std::max(span, r.makespan);
        if (!r.series.empty()) span = std::max(span, r.series.back().t);
    }
    const TimeAxis ax{span};
    double y = 56;
    for (size_t i = 0; i < results.size(); ++i) {
        const auto& r = results[i];
        const auto& sm = summaries[i];
        s.text(kLeft, y + 18,
               fmt::format("{}: mean wait {}, p95 {}, utilisation {:.1f}%, {} restarts", r.policy,
                           format_duration(sm.mean_wait_s), format_duration(sm.p95_wait_s),
                           100 * sm.utilisation, sm.restarts),
               14, "start", fmt::format("fill=\"{}\" font-weight=\"bold\"", series_color(int(i))));
        if (gantt_fits) {
            gantt(s, r, cfg, ax, y + 28);
        } else {
            heatmap(s, r, cfg, ax, y + 28);
        }
        utilisation(s, r, ax, y + 28 + kGanttH + 10);
        time_ticks(s, ax, y + 28 + kGanttH + 10 + kUtilH);
        y += block;
    }
    comparison(s, summaries, y + 40);
    return s.str();
}

}  // namespace apiary::sim
