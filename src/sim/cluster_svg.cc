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
    s.text(kLeft + kPlotW - 6, y0 + 13, "jobs queued (right axis)", 11, "end",
           "fill=\"#ff7f0e\"");
}

// One bar chart per metric, one bar per policy.
void comparison(Svg& s, const std::vector<Summary>& sum, double y0) {
    const auto [wunit, wdiv] = time_unit(std::max(
        1.0, std::max_element(sum.begin(), sum.end(), [](const Summary& a, const Summary& b) {
                 return a.p95_wait_s < b.p95_wait_s;
             })->p95_wait_s));
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
    const double cw = kPlotW / double(m.size()), ch = 150, top = y0 + 40;
    for (size_t k = 0; k < m.size(); ++k) {
        const double x0 = kLeft + cw * double(k) + 10, w = cw - 30;
        double hi = 0;
        for (const auto& x : sum) hi = std::max(hi, m[k].get(x) * m[k].scale);
        if (hi <= 0) hi = 1;
        s.text(x0 + w / 2, top - 12, m[k].name, 12, "middle");
        s.line(x0, top + ch, x0 + w, top + ch, "#555");
        const double bw = w / double(sum.size());
        for (size_t p = 0; p < sum.size(); ++p) {
            const double v = m[k].get(sum[p]) * m[k].scale;
            const double h = ch * v / hi;
            s.rect(x0 + bw * double(p) + 2, top + ch - h, bw - 4, h, series_color(int(p)));
            s.text(x0 + bw * (double(p) + 0.5), top + ch - h - 3, short_number(v), 10, "middle");
        }
    }
}

}  // namespace

std::string cluster_svg(const std::vector<SimResult>& results,
                        const std::vector<Summary>& summaries, const SimConfig& cfg,
                        const std::string& title) {
    const double block = 28 + kGanttH + 10 + kUtilH + 40;
    Svg s(kW, 40 + block * double(results.size()) + 240);
    s.text(kLeft, 26, title, 16, "start", "font-weight=\"bold\"");
    double span = 1;
    for (const auto& r : results) {
        span = std::max(span, r.makespan);
        if (!r.series.empty()) span = std::max(span, r.series.back().t);
    }
    const TimeAxis ax{span};
    double y = 40;
    for (size_t i = 0; i < results.size(); ++i) {
        const auto& r = results[i];
        const auto& sm = summaries[i];
        s.text(kLeft, y + 18,
               fmt::format("{}: mean wait {}, p95 {}, utilisation {:.1f}%, {} restarts",
                           r.policy, fmt::format("{:.3g} h", sm.mean_wait_s / 3600),
                           fmt::format("{:.3g} h", sm.p95_wait_s / 3600), 100 * sm.utilisation,
                           sm.restarts),
               14, "start", fmt::format("fill=\"{}\" font-weight=\"bold\"", series_color(int(i))));
        if (r.segments.size() <= kMaxGanttRects && cfg.devices() <= 4096) {
            gantt(s, r, cfg, ax, y + 28);
        } else {
            s.rect(kLeft, y + 28, kPlotW, kGanttH, "#f3f3f3");
            s.text(kLeft + kPlotW / 2, y + 28 + kGanttH / 2,
                   fmt::format("Gantt chart left out: {} runs on {} devices (draw a shorter "
                               "trace or fewer devices)",
                               r.segments.size(), cfg.devices()),
                   13, "middle");
        }
        utilisation(s, r, ax, y + 28 + kGanttH + 10);
        time_ticks(s, ax, y + 28 + kGanttH + 10 + kUtilH);
        y += block;
    }
    comparison(s, summaries, y + 20);
    return s.str();
}

}  // namespace apiary::sim
