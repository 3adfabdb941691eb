#pragma once
// Run reports: a run directory's metrics.jsonl read back, summarised, and
// drawn against steps (loss, tokens/s, MFU) in the terminal or as one
// self-contained HTML page (inline SVG, no scripts) with several runs on
// the same axes.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace apiary::obs {

struct RunSeries {
    std::string name, dir;
    std::vector<double> step, loss, tokens_per_s, mfu, step_time_s;
    std::vector<double> eval_step, eval_loss;
    double elapsed_s = 0;
    int64_t world_size = 1;
    std::vector<std::string> notes;  // e.g. a torn last line that was skipped
};

// Reads dir/metrics.jsonl. IoError for a missing directory or file,
// DataError (file:line) for a malformed record other than a torn last line
// (which a crash can leave; it is skipped with a note), and for a file
// with no step records.
RunSeries read_run(const std::string& dir);

// One column per run: steps, losses, throughput, MFU, time; as (label,
// cell per run) rows, and as text.
using SummaryRows = std::vector<std::pair<std::string, std::vector<std::string>>>;
SummaryRows summary_rows(const std::vector<RunSeries>& runs);
std::string format_summary(const std::vector<RunSeries>& runs);

enum class Metric { loss, tokens_per_s, mfu };
const char* metric_title(Metric m);
const std::vector<double>& metric_values(const RunSeries& r, Metric m);

// The extent of a metric over every run's finite values (y in plotted
// units: MFU in %). empty: no finite value.
struct Extent {
    double x0, x1, y0, y1, scale;
    bool empty() const;
};
Extent metric_extent(const std::vector<RunSeries>& runs, Metric m);

// A plot of one metric against steps, width x height characters of
// plotting area, one marker (and with color, one ANSI color) per run.
std::string plot_terminal(const std::vector<RunSeries>& runs, Metric m, int width, int height,
                          bool color);

// The whole report as one HTML page.
std::string report_html(const std::vector<RunSeries>& runs);

// Axis ticks: about n "nice" values (1, 2, 5 x 10^k steps) covering lo..hi.
std::vector<double> nice_ticks(double lo, double hi, int n);
// A tick label: 1.5k, 2M, 0.25, 3.1e-05.
std::string tick_label(double v);

}  // namespace apiary::obs
