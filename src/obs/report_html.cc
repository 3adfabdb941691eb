// The HTML run report: one page, no scripts or external files, an inline
// SVG chart per metric with every run on the same axes, and the summary
// table with one column per run.

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/text.h"
#include "obs/report.h"

namespace apiary::obs {

namespace {

constexpr const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                                   "#9467bd", "#8c564b", "#e377c2", "#17becf"};

std::string escape(const std::string& s) { return core::xml_escape(s); }

struct Frame {
    double x0, x1, y0, y1;
    double left = 64, right = 16, top = 34, bottom = 44, width = 560, height = 320;
    double px(double x) const { return left + (x - x0) / (x1 - x0) * (width - left - right); }
    double py(double y) const {
        return height - bottom - (y - y0) / (y1 - y0) * (height - top - bottom);
    }
};

std::string axes(const Frame& f, const std::vector<double>& xt, const std::vector<double>& yt,
                 const std::string& title) {
    std::string s = fmt::format(
        "<text x='{}' y='20' font-size='15' font-weight='bold'>{}</text>\n"
        "<rect x='{}' y='{}' width='{}' height='{}' fill='#fafafa' stroke='#888'/>\n",
        f.left, escape(title), f.left, f.top, f.width - f.left - f.right,
        f.height - f.top - f.bottom);
    for (double y : yt) {
        s += fmt::format(
            "<line x1='{:.1f}' y1='{:.1f}' x2='{:.1f}' y2='{:.1f}' stroke='#ddd'/>"
            "<text x='{:.1f}' y='{:.1f}' font-size='11' text-anchor='end'>{}</text>\n",
            f.left, f.py(y), f.width - f.right, f.py(y), f.left - 6, f.py(y) + 4, tick_label(y));
    }
    for (double x : xt) {
        s += fmt::format(
            "<line x1='{:.1f}' y1='{:.1f}' x2='{:.1f}' y2='{:.1f}' stroke='#ddd'/>"
            "<text x='{:.1f}' y='{:.1f}' font-size='11' text-anchor='middle'>{}</text>\n",
            f.px(x), f.top, f.px(x), f.height - f.bottom, f.px(x), f.height - f.bottom + 16,
            tick_label(x));
    }
    s +=
        fmt::format("<text x='{:.1f}' y='{:.1f}' font-size='12' text-anchor='middle'>step</text>\n",
                    (f.left + f.width - f.right) / 2, f.height - 8);
    return s;
}

// The loss chart also draws each run's held-out loss (the table reports
// its best): dashed, with a dot per evaluation, on the same axes.
bool with_eval(Metric m) { return m == Metric::loss; }

std::string chart(const std::vector<RunSeries>& runs, Metric m) {
    Extent e = metric_extent(runs, m);
    if (with_eval(m)) {
        for (const auto& r : runs) {
            for (size_t i = 0; i < r.eval_loss.size(); ++i) {
                if (!std::isfinite(r.eval_loss[i])) continue;
                e.x0 = std::min(e.x0, r.eval_step[i]), e.x1 = std::max(e.x1, r.eval_step[i]);
                e.y0 = std::min(e.y0, r.eval_loss[i]), e.y1 = std::max(e.y1, r.eval_loss[i]);
            }
        }
    }
    if (e.empty()) return "";
    const double x0 = e.x0, x1 = e.x1, y0 = e.y0, y1 = e.y1, scale = e.scale;
    const auto yt = nice_ticks(y0, y1, 5);
    const auto xt = nice_ticks(x0, x1, 6);
    Frame f{std::min(x0, xt.front()), std::max(x1 > x0 ? x1 : x0 + 1, xt.back()),
            std::min(y0, yt.front()), std::max(y1, yt.back())};
    if (f.y1 <= f.y0) f.y1 = f.y0 + 1;
    if (f.x1 <= f.x0) f.x1 = f.x0 + 1;
    std::string s = fmt::format(
        "<svg class='chart' xmlns='http://www.w3.org/2000/svg' width='{}' height='{}' "
        "font-family='sans-serif'>\n",
        f.width, f.height);
    s += axes(f, xt, yt,
              with_eval(m) ? "loss (nats/token): training, held-out dashed" : metric_title(m));
    for (size_t k = 0; k < runs.size(); ++k) {
        const auto& v = metric_values(runs[k], m);
        std::string pts;
        for (size_t i = 0; i < v.size(); ++i) {
            if (std::isfinite(v[i])) {
                pts += fmt::format("{:.1f},{:.1f} ", f.px(runs[k].step[i]), f.py(v[i] * scale));
            }
        }
        s += fmt::format(
            "<polyline class='series' points='{}' fill='none' stroke='{}' stroke-width='2.5'/>\n",
            pts, kColors[k % 8]);
        if (v.size() == 1 && std::isfinite(v[0])) {
            s += fmt::format("<circle cx='{:.1f}' cy='{:.1f}' r='4' fill='{}'/>\n",
                             f.px(runs[k].step[0]), f.py(v[0] * scale), kColors[k % 8]);
        }
        if (with_eval(m) && !runs[k].eval_loss.empty()) {
            std::string eval_pts, dots;
            for (size_t i = 0; i < runs[k].eval_loss.size(); ++i) {
                const double x = runs[k].eval_step[i], y = runs[k].eval_loss[i];
                if (!std::isfinite(y)) continue;
                eval_pts += fmt::format("{:.1f},{:.1f} ", f.px(x), f.py(y));
                dots +=
                    fmt::format("<circle class='eval' cx='{:.1f}' cy='{:.1f}' r='3.5' fill='{}'/>",
                                f.px(x), f.py(y), kColors[k % 8]);
            }
            s += fmt::format(
                "<polyline class='series eval' points='{}' fill='none' stroke='{}' "
                "stroke-width='2' stroke-dasharray='6 4'/>\n{}\n",
                eval_pts, kColors[k % 8], dots);
        }
        // The legend runs along the top, right of the title, off the lines.
        const double lx = f.width - f.right - 110 * double(runs.size() - k);
        s += fmt::format(
            "<rect x='{:.1f}' y='12' width='14' height='4' fill='{}'/>"
            "<text x='{:.1f}' y='18' font-size='12'>{}</text>\n",
            lx, kColors[k % 8], lx + 18, escape(runs[k].name));
    }
    return s + "</svg>\n";
}

}  // namespace

std::string report_html(const std::vector<RunSeries>& runs) {
    std::string names;
    for (const auto& r : runs) names += (names.empty() ? "" : ", ") + r.name;
    std::string s = fmt::format(
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>\n"
        "<title>apiary runs: {}</title>\n<style>\n"
        "body {{ font-family: sans-serif; margin: 24px; color: #222; }}\n"
        ".charts {{ display: flex; flex-wrap: wrap; gap: 16px; }}\n"
        "table {{ border-collapse: collapse; margin-top: 20px; }}\n"
        "td, th {{ border: 1px solid #ccc; padding: 4px 10px; text-align: right; }}\n"
        "th {{ background: #f0f0f0; }}\n</style></head><body>\n"
        "<h1>apiary runs: {}</h1>\n<div class='charts'>\n",
        escape(names), escape(names));
    for (Metric m : {Metric::loss, Metric::tokens_per_s, Metric::mfu}) s += chart(runs, m);
    s += "</div>\n<table>\n";
    s += "<tr><th>run</th>";
    for (const auto& r : runs) s += fmt::format("<th>{}</th>", escape(r.name));
    s += "</tr>\n";
    for (const auto& [label, cells] : summary_rows(runs)) {
        s += fmt::format("<tr><th>{}</th>", escape(label));
        for (const auto& c : cells) s += fmt::format("<td>{}</td>", escape(c));
        s += "</tr>\n";
    }
    return s + "</table>\n</body></html>\n";
}

}  // namespace apiary::obs
