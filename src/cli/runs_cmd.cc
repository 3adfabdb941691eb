// `apiary runs show RUN [RUN...] [--html OUT]`: each run's summary, and
// loss, throughput and MFU against steps drawn in the terminal; --html
// writes the same as one self-contained page, the runs side by side.

#include <fmt/format.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include "cli/command.h"
#include "core/error.h"
#include "obs/report.h"

namespace apiary::cli {

namespace {

struct Args {
    std::vector<std::string> runs;
    std::string html;
    int width = 64;
    int height = 12;
    bool no_plots = false;
};

void show(const Args& a) {
    std::vector<obs::RunSeries> runs;
    for (const auto& dir : a.runs) runs.push_back(obs::read_run(dir));
    fmt::print("{}", obs::format_summary(runs));
    if (!a.no_plots) {
        const bool color = ::isatty(STDOUT_FILENO);
        for (auto m : {obs::Metric::loss, obs::Metric::tokens_per_s, obs::Metric::mfu}) {
            fmt::print("\n{}", obs::plot_terminal(runs, m, a.width, a.height, color));
        }
    }
    if (!a.html.empty()) {
        const std::string page = obs::report_html(runs);
        std::ofstream out(a.html, std::ios::trunc);
        out << page;
        out.flush();
        if (!out) throw IoError(fmt::format("--html {}: cannot write the report", a.html));
        fmt::print("\nwrote {} ({} run{})\n", a.html, runs.size(), runs.size() == 1 ? "" : "s");
    }
}

void setup(CLI::App& app) {
    auto* cmd = app.add_subcommand("runs", "look at finished or running training runs");
    cmd->require_subcommand(1);
    static Args a;
    auto* s = cmd->add_subcommand(
        "show", "summary and loss / tokens/s / MFU plots of one or more run directories");
    s->add_option("runs", a.runs, "run directories (RUN/metrics.jsonl)")->required();
    s->add_option("--html", a.html, "also write a self-contained HTML report to this file");
    s->add_option("--width", a.width, "plot width in characters")
        ->check(CLI::Range(16, 1000))
        ->capture_default_str();
    s->add_option("--height", a.height, "plot height in lines")
        ->check(CLI::Range(4, 200))
        ->capture_default_str();
    s->add_flag("--no-plots", a.no_plots, "print the summary only");
    s->callback([] { show(a); });
}

CommandRegistrar reg("runs", setup);

}  // namespace

}  // namespace apiary::cli
