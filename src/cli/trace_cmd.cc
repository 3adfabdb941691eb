// `apiary trace merge RUN` and `apiary trace summary RUN`: the per-rank
// trace files a run wrote for its profile.steps (trace/rank_NNNNN.json),
// put on one timeline for Perfetto, or split into compute, exposed
// communication, data wait, optimizer and idle time per rank and per layer.

#include <fmt/format.h>

#include <string>
#include <vector>

#include "cli/command.h"
#include "obs/trace_file.h"
#include "obs/trace_summary.h"

namespace apiary::cli {

namespace {

struct Args {
    std::string run;
    std::string out;
    bool json = false;
};

void merge(const Args& a) {
    const auto files = obs::trace_files(a.run);
    const std::string path = obs::merge_traces(a.run, a.out);
    fmt::print(
        "merged {} rank trace{} into {} (open it in https://ui.perfetto.dev or "
        "chrome://tracing)\n",
        files.size(), files.size() == 1 ? "" : "s", path);
}

void summary(const Args& a) {
    std::vector<obs::RankTrace> ranks;
    for (const auto& f : obs::trace_files(a.run)) ranks.push_back(obs::read_trace(f));
    const obs::TraceSummary s = obs::summarize(ranks);
    fmt::print("{}\n", a.json ? obs::summary_json(s) : obs::format_summary(s));
}

void setup(CLI::App& app) {
    auto* cmd = app.add_subcommand("trace", "merge and summarise a run's timeline traces");
    cmd->require_subcommand(1);
    static Args a;
    auto* m = cmd->add_subcommand(
        "merge", "put every rank's trace of RUN on one timeline (RUN/trace/merged.json)");
    m->add_option("run", a.run, "run directory")->required();
    m->add_option("-o,--out", a.out, "output file (default RUN/trace/merged.json)");
    m->callback([] { merge(a); });
    auto* s = cmd->add_subcommand(
        "summary",
        "per rank and per layer: compute, exposed communication, data wait, optimizer, idle");
    s->add_option("run", a.run, "run directory")->required();
    s->add_flag("--json", a.json, "print JSON instead of tables");
    s->callback([] { summary(a); });
}

CommandRegistrar reg("trace", setup);

}  // namespace

}  // namespace apiary::cli
