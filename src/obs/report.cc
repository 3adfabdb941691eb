#include "obs/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace apiary::obs {

namespace fs = std::filesystem;

RunSeries read_run(const std::string& dir) {
    if (!fs::is_directory(dir)) throw IoError(fmt::format("{}: no such run directory", dir));
    const std::string path = (fs::path(dir) / "metrics.jsonl").string();
    std::ifstream in(path);
    if (!in) {
        throw IoError(
            fmt::format("{}: missing; {} is not a run directory with metrics (a run "
                        "writes metrics.jsonl from its first logged step)",
                        path, dir));
    }
    RunSeries r;
    r.dir = dir;
    r.name = fs::path(dir).filename().string();
    if (r.name.empty()) r.name = fs::path(dir).parent_path().filename().string();
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    for (size_t i = 0; i < lines.size(); ++i) {
        if (lines[i].empty()) continue;
        nlohmann::json rec;
        try {
            rec = nlohmann::json::parse(lines[i]);
        } catch (const nlohmann::json::parse_error& e) {
            if (i + 1 == lines.size()) {
                r.notes.push_back(
                    fmt::format("{}:{}: a torn last record was skipped", path, i + 1));
                continue;
            }
            throw DataError(fmt::format("{}:{}: not a JSON record ({})", path, i + 1, e.what()));
        }
        if (!rec.is_object() || !rec.contains("step") || !rec["step"].is_number()) continue;
        const double step = rec["step"].get<double>();
        if (rec.contains("eval_loss") && rec["eval_loss"].is_number()) {
            r.eval_step.push_back(step);
            r.eval_loss.push_back(rec["eval_loss"].get<double>());
        }
        if (!rec.contains("loss") || !rec["loss"].is_number()) continue;
        r.step.push_back(step);
        r.loss.push_back(rec["loss"].get<double>());
        r.tokens_per_s.push_back(rec.value("tokens_per_s", NAN));
        r.mfu.push_back(rec.value("mfu", NAN));
        r.step_time_s.push_back(rec.value("step_time_s", NAN));
        r.elapsed_s = rec.value("elapsed_s", r.elapsed_s);
        r.world_size = rec.value("world_size", r.world_size);
    }
    if (r.step.empty()) {
        throw DataError(
            fmt::format("{}: no step records (a run writes one every train.log_every "
                        "steps); nothing to show",
                        path));
    }
    return r;
}

const char* metric_title(Metric m) {
    switch (m) {
        case Metric::loss:
            return "training loss (nats/token)";
        case Metric::tokens_per_s:
            return "throughput (tokens/s)";
        case Metric::mfu:
            return "MFU (%)";
    }
    return "";
}

const std::vector<double>& metric_values(const RunSeries& r, Metric m) {
    switch (m) {
        case Metric::tokens_per_s:
            return r.tokens_per_s;
        case Metric::mfu:
            return r.mfu;
        default:
            return r.loss;
    }
}

namespace {

double mean(const std::vector<double>& v, size_t from = 0) {
    double s = 0;
    size_t n = 0;
    for (size_t i = from; i < v.size(); ++i) {
        if (std::isfinite(v[i])) s += v[i], ++n;
    }
    return n ? s / double(n) : NAN;
}

std::string num(double v, const char* f = "{:.4f}") {
    return std::isfinite(v) ? fmt::format(fmt::runtime(f), v) : "-";
}

}  // namespace

SummaryRows summary_rows(const std::vector<RunSeries>& runs) {
    SummaryRows rows = {{"directory", {}},      {"ranks", {}},
                        {"steps", {}},          {"final loss", {}},
                        {"best eval loss", {}}, {"tokens/s (mean)", {}},
                        {"MFU (mean)", {}},     {"step time (mean)", {}},
                        {"elapsed", {}}};
    for (const auto& r : runs) {
        // Means leave out the first record: it holds the warm-up steps.
        const size_t from = r.step.size() > 1 ? 1 : 0;
        const double best =
            r.eval_loss.empty() ? NAN : *std::min_element(r.eval_loss.begin(), r.eval_loss.end());
        const std::vector<std::string> col = {r.dir,
                                              std::to_string(r.world_size),
                                              fmt::format("{:.0f}", r.step.back()),
                                              num(r.loss.back()),
                                              num(best),
                                              num(mean(r.tokens_per_s, from), "{:.0f}"),
                                              std::isfinite(mean(r.mfu, from))
                                                  ? fmt::format("{:.1f}%", 100 * mean(r.mfu, from))
                                                  : "-",
                                              num(mean(r.step_time_s, from), "{:.3f} s"),
                                              num(r.elapsed_s, "{:.1f} s")};
        for (size_t i = 0; i < rows.size(); ++i) rows[i].second.push_back(col[i]);
    }
    return rows;
}

std::string format_summary(const std::vector<RunSeries>& runs) {
    const SummaryRows rows = summary_rows(runs);
    size_t w = 0;
    for (const auto& r : runs) w = std::max(w, std::max<size_t>(r.name.size(), 12));
    for (const auto& [label, cells] : rows) {
        for (const auto& c : cells) w = std::max(w, c.size());
    }
    std::string out = fmt::format("{:<18}", "run");
    for (const auto& r : runs) out += fmt::format("  {:>{}}", r.name, w);
    out += "\n";
    for (const auto& [label, cells] : rows) {
        out += fmt::format("{:<18}", label);
        for (const auto& c : cells) out += fmt::format("  {:>{}}", c, w);
        out += "\n";
    }
    for (const auto& r : runs) {
        for (const auto& n : r.notes) out += fmt::format("note: {}\n", n);
    }
    return out;
}

std::vector<double> nice_ticks(double lo, double hi, int n) {
    if (!(hi > lo)) {
        const double pad = lo == 0 ? 1.0 : std::fabs(lo) * 0.1;
        lo -= pad;
        hi += pad;
    }
    const double raw = (hi - lo) / std::max(1, n);
    const double mag = std::pow(10.0, std::floor(std::log10(raw)));
    double step = mag;
    for (double m : {1.0, 2.0, 5.0, 10.0}) {
        step = m * mag;
        if (step >= raw) break;
    }
    std::vector<double> out;
    for (double v = std::ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) {
        out.push_back(std::fabs(v) < step * 1e-9 ? 0.0 : v);
    }
    return out;
}

std::string tick_label(double v) {
    const double a = std::fabs(v);
    if (a >= 1e6) return fmt::format("{:.4g}M", v / 1e6);
    if (a >= 1e4) return fmt::format("{:.4g}k", v / 1e3);
    if (a != 0 && a < 1e-3) return fmt::format("{:.1e}", v);
    return fmt::format("{:.4g}", v);
}

bool Extent::empty() const { return !std::isfinite(x0); }

Extent metric_extent(const std::vector<RunSeries>& runs, Metric m) {
    Extent e{INFINITY, -INFINITY, INFINITY, -INFINITY, m == Metric::mfu ? 100.0 : 1.0};
    for (const auto& r : runs) {
        const auto& v = metric_values(r, m);
        for (size_t i = 0; i < v.size(); ++i) {
            if (!std::isfinite(v[i])) continue;
            e.x0 = std::min(e.x0, r.step[i]), e.x1 = std::max(e.x1, r.step[i]);
            e.y0 = std::min(e.y0, v[i] * e.scale), e.y1 = std::max(e.y1, v[i] * e.scale);
        }
    }
    return e;
}

std::string plot_terminal(const std::vector<RunSeries>& runs, Metric m, int width, int height,
                          bool color) {
    const Extent e = metric_extent(runs, m);
    std::string out = fmt::format("{}\n", metric_title(m));
    if (e.empty()) return out + "  (no values)\n";
    double x0 = e.x0, x1 = e.x1, y0 = e.y0, y1 = e.y1;
    const double scale = e.scale;
    if (y1 <= y0) y0 -= 0.5, y1 += 0.5;
    if (x1 <= x0) x1 = x0 + 1;
    std::vector<std::string> grid(size_t(height), std::string(size_t(width), ' '));
    std::vector<std::vector<int>> owner(size_t(height), std::vector<int>(size_t(width), -1));
    static const char kMarks[] = "*+ox#@%&";
    for (size_t k = 0; k < runs.size(); ++k) {
        const auto& r = runs[k];
        const auto& v = metric_values(r, m);
        int prev_row = -1;
        // Each column shows the last record at or before its step; columns
        // between records join the points with a vertical run.
        for (int c = 0; c < width; ++c) {
            const double xs = x0 + (x1 - x0) * double(c) / std::max(1, width - 1);
            const auto it = std::upper_bound(r.step.begin(), r.step.end(), xs + 1e-9);
            if (it == r.step.begin()) continue;
            const double y = v[size_t(it - r.step.begin() - 1)] * scale;
            if (!std::isfinite(y)) continue;
            const int row = height - 1 - int(std::lround((y - y0) / (y1 - y0) * (height - 1)));
            const int lo = prev_row < 0 ? row : std::min(row, prev_row);
            const int hi = prev_row < 0 ? row : std::max(row, prev_row);
            for (int rr = lo; rr <= hi; ++rr) {
                grid[size_t(rr)][size_t(c)] = kMarks[k % 8];
                owner[size_t(rr)][size_t(c)] = int(k);
            }
            prev_row = row;
        }
    }
    for (int row = 0; row < height; ++row) {
        const double y = y1 - (y1 - y0) * double(row) / std::max(1, height - 1);
        const bool label = row == 0 || row == height - 1 || row == height / 2;
        out += fmt::format("{:>9} |", label ? tick_label(y) : "");
        for (int c = 0; c < width; ++c) {
            const int k = owner[size_t(row)][size_t(c)];
            if (color && k >= 0) {
                out += fmt::format("\033[3{}m{}\033[0m", 1 + k % 6, grid[size_t(row)][size_t(c)]);
            } else {
                out += grid[size_t(row)][size_t(c)];
            }
        }
        out += "\n";
    }
    out += fmt::format("{:>9} +{}\n", "", std::string(size_t(width), '-'));
    const std::string left = tick_label(x0), right = tick_label(x1);
    out += fmt::format("{:>9}  {}{:>{}}  step\n", "", left, right,
                       std::max<int>(1, width - int(left.size())));
    std::string legend;
    for (size_t k = 0; k < runs.size(); ++k) {
        legend += fmt::format("{}{} {}", k ? "   " : "", kMarks[k % 8], runs[k].name);
    }
    return out + fmt::format("{:>11}{}\n", "", legend);
}

}  // namespace apiary::obs
