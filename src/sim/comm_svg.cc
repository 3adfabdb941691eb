// The collective simulation drawn: a group of bars per job, one bar per
// placement (its time with the other jobs on the fabric, the time alone as
// a lighter bar behind it), and the planner's alpha-beta time as a dashed
// line across the group.

#include <fmt/format.h>

#include <algorithm>

#include "sim/pictures.h"
#include "sim/svg.h"

namespace apiary::sim {

std::string comm_svg(const CommBars& b, const std::string& title) {
    const double left = 80, right = 30, top = 104, plot_h = 320;
    const double group_w = std::max(160.0, 70.0 * double(b.placements.size()) + 40);
    const double w = std::max(760.0, left + right + group_w * double(b.jobs.size()));
    Svg s(w, top + plot_h + 50);
    s.text(left, 28, title, 16, "start", "font-weight=\"bold\"");
    s.text(left, 48, "bars: each job's collective with all the jobs on the fabric at once", 12,
           "start", "fill=\"#444\"");
    s.text(left, 64, "light bars: the job alone; dashed: the planner's alpha-beta time", 12,
           "start", "fill=\"#444\"");
    double hi = 0;
    for (size_t p = 0; p < b.placements.size(); ++p) {
        for (size_t j = 0; j < b.jobs.size(); ++j) {
            hi = std::max({hi, b.shared_s[p][j], b.alone_s[p][j]});
        }
    }
    for (double v : b.planner_s) hi = std::max(hi, v);
    if (hi <= 0) hi = 1;
    const auto [unit, div] = hi < 1e-3 ? std::pair<std::string, double>{"us", 1e-6}
                             : hi < 1  ? std::pair<std::string, double>{"ms", 1e-3}
                                       : std::pair<std::string, double>{"s", 1.0};
    const auto ticks = nice_ticks(0, hi / div, 6);
    const double top_v = std::max(hi / div, ticks.empty() ? 1.0 : ticks.back());
    auto y = [&](double sec) { return top + plot_h * (1 - sec / div / top_v); };
    for (double v : ticks) {
        s.line(left, y(v * div), w - right, y(v * div), "#e5e5e5");
        s.text(left - 6, y(v * div) + 4, fmt::format("{:g}", v), 11, "end");
    }
    s.text(20, top + plot_h / 2, "time per collective (" + unit + ")", 12, "middle",
           fmt::format("transform=\"rotate(-90 20 {:.1f})\"", top + plot_h / 2));
    double lx = left;
    for (size_t p = 0; p < b.placements.size(); ++p) {
        s.rect(lx, 76, 12, 12, series_color(int(p)));
        s.text(lx + 16, 86, b.placements[p], 12);
        lx += 30 + 8.0 * double(b.placements[p].size());
    }
    const double bar_w = (group_w - 40) / double(std::max<size_t>(1, b.placements.size()));
    for (size_t j = 0; j < b.jobs.size(); ++j) {
        const double gx = left + group_w * double(j) + 20;
        for (size_t p = 0; p < b.placements.size(); ++p) {
            const double x = gx + bar_w * double(p);
            const std::string c = series_color(int(p));
            s.rect(x + 2, y(b.alone_s[p][j]), bar_w - 4, y(0) - y(b.alone_s[p][j]), c,
                   "fill-opacity=\"0.3\"");
            s.rect(x + 8, y(b.shared_s[p][j]), bar_w - 16, y(0) - y(b.shared_s[p][j]), c);
            s.text(x + bar_w / 2, y(b.shared_s[p][j]) - 4,
                   fmt::format("{:.3g}", b.shared_s[p][j] / div), 10, "middle");
        }
        const double py = y(b.planner_s[j]);
        s.raw(fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" "
                          "stroke=\"#222\" stroke-width=\"1.5\" stroke-dasharray=\"6,4\"/>\n",
                          gx, py, gx + group_w - 40, py));
        s.text(gx + (group_w - 40) / 2, top + plot_h + 18, fmt::format("job {}", j + 1), 12,
               "middle", "font-weight=\"bold\"");
        s.text(gx + (group_w - 40) / 2, top + plot_h + 34, b.jobs[j], 11, "middle");
    }
    s.line(left, y(0), w - right, y(0), "#555");
    return s.str();
}

}  // namespace apiary::sim
