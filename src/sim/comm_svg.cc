// The collective simulation drawn: a group of bars per job, one bar per
// placement (its time with the other jobs on the fabric, the time alone as
// a lighter bar behind it), relative to the planner's alpha-beta time.

#include <fmt/format.h>

#include <algorithm>

#include "sim/pictures.h"
#include "sim/svg.h"

namespace apiary::sim {

// Bars are each job's time over the planner's alpha-beta time for it, so
// jobs of any size share one axis and 1 is "as the formula says".
std::string comm_svg(const CommBars& b, const std::string& title) {
    const double left = 80, right = 30, top = 104, plot_h = 300;
    const double group_w = std::max(130.0, 48.0 * double(b.placements.size()) + 40);
    const double w = std::max(900.0, left + right + group_w * double(b.jobs.size()));
    Svg s(w, top + plot_h + 50);
    s.text(left, 28, title, 16, "start", "font-weight=\"bold\"");
    s.text(left, 48,
           "bars: each job's collective with all the jobs on the fabric at once, over the "
           "planner's alpha-beta time (dashed: 1); labels in ms",
           12, "start", "fill=\"#444\"");
    s.text(left, 64, "light bars: the job alone on the fabric", 12, "start", "fill=\"#444\"");
    auto ratio = [&](double t, size_t j) { return b.planner_s[j] > 0 ? t / b.planner_s[j] : 0; };
    double hi = 1.2;
    for (size_t p = 0; p < b.placements.size(); ++p) {
        for (size_t j = 0; j < b.jobs.size(); ++j) {
            hi = std::max({hi, ratio(b.shared_s[p][j], j), ratio(b.alone_s[p][j], j)});
        }
    }
    const auto ticks = nice_ticks(0, hi, 6);
    const double top_v = std::max(hi * 1.1, ticks.back());
    auto y = [&](double v) { return top + plot_h * (1 - v / top_v); };
    for (double v : ticks) {
        s.line(left, y(v), w - right, y(v), "#e5e5e5");
        s.text(left - 6, y(v) + 4, fmt::format("{:g}x", v), 11, "end");
    }
    s.raw(
        fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" "
                    "stroke=\"#222\" stroke-width=\"1.5\" stroke-dasharray=\"6,4\"/>\n",
                    left, y(1), w - right, y(1)));
    s.text(20, top + plot_h / 2, "time / alpha-beta time", 12, "middle",
           fmt::format("transform=\"rotate(-90 20 {:.1f})\"", top + plot_h / 2));
    double lx = left;
    for (size_t p = 0; p < b.placements.size(); ++p) {
        s.rect(lx, 76, 12, 12, series_color(int(p)));
        s.text(lx + 16, 86, b.placements[p], 12);
        lx += 30 + 8.0 * double(b.placements[p].size());
    }
    const double bar_w = (group_w - 30) / double(std::max<size_t>(1, b.placements.size()));
    for (size_t j = 0; j < b.jobs.size(); ++j) {
        const double gx = left + group_w * double(j) + 15;
        for (size_t p = 0; p < b.placements.size(); ++p) {
            const double x = gx + bar_w * double(p);
            const std::string c = series_color(int(p));
            const double alone = ratio(b.alone_s[p][j], j), shared = ratio(b.shared_s[p][j], j);
            s.rect(x + 1, y(alone), bar_w - 2, y(0) - y(alone), c, "fill-opacity=\"0.3\"");
            s.rect(x + 5, y(shared), bar_w - 10, y(0) - y(shared), c);
            s.text(x + bar_w / 2, y(std::max(alone, shared)) - 4,
                   fmt::format("{:.3g}", b.shared_s[p][j] * 1e3), 9, "middle");
        }
        s.text(gx + (group_w - 30) / 2, top + plot_h + 18, fmt::format("job {}", j + 1), 12,
               "middle", "font-weight=\"bold\"");
        s.text(gx + (group_w - 30) / 2, top + plot_h + 34, b.jobs[j], 10, "middle");
    }
    s.line(left, y(0), w - right, y(0), "#555");
    return s.str();
}

}  // namespace apiary::sim
