// The Standard Workload Format (SWF) of the Parallel Workloads Archive
// (Feitelson et al., https://www.cs.huji.ac.il/labs/parallel/workload/swf.html):
// one job a line, 18 whitespace-separated numeric fields, -1 for unknown,
// and a header of "; Key: value" comment lines. Every field is checked; a
// field the archive defines as -1 or >= 0 that is anything else is an error
// naming the file, line and field.

#include <fmt/format.h>

#include <cmath>
#include <map>
#include <set>

#include "core/error.h"
#include "sim/text.h"
#include "sim/trace.h"

namespace apiary::sim {

namespace {

// The 18 fields, in order, as the archive names them.
constexpr const char* kFields[18] = {
    "job number",
    "submit time",
    "wait time",
    "run time",
    "allocated processors",
    "average CPU time used",
    "used memory",
    "requested processors",
    "requested time",
    "requested memory",
    "status",
    "user id",
    "group id",
    "executable number",
    "queue number",
    "partition number",
    "preceding job number",
    "think time from preceding job",
};

struct SwfField {
    double v;
    bool known() const { return v != -1; }
};

// Field k (1-based) of a job line: a number, -1 (unknown) or >= 0.
SwfField field(const std::string& text, int k, const std::string& where) {
    const std::string name = fmt::format("field {} ({})", k, kFields[k - 1]);
    double v = 0;
    if (!parse_double(text, &v)) {
        throw DataError(fmt::format("{}: {}: '{}' is not a number", where, name, printable(text)));
    }
    if (v < 0 && v != -1) {
        throw DataError(
            fmt::format("{}: {}: {} is negative (the archive allows -1 for unknown, else >= 0)",
                        where, name, text));
    }
    // Identifiers and counts are whole numbers; times and averages may not be.
    const bool whole = k == 1 || k == 5 || k == 8 || (k >= 11 && k <= 17);
    if (whole && v != std::floor(v)) {
        throw DataError(
            fmt::format("{}: {}: {} is not a whole number", where, name, printable(text)));
    }
    return SwfField{v};
}

// "; MaxNodes: 4360" -> 4360, checked.
long long header_count(const std::string& value, const std::string& key, const std::string& where) {
    double v = 0;
    if (!parse_double(value, &v) || v < 1 || v != std::floor(v) || v > 1e9) {
        throw DataError(fmt::format("{}: header {}: '{}' is not a whole number >= 1", where, key,
                                    printable(value)));
    }
    return (long long)v;
}

std::vector<std::string> words(const std::string& line) {
    std::vector<std::string> w;
    size_t i = 0;
    while (i < line.size()) {
        while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
        const size_t b = i;
        while (i < line.size() && line[i] != ' ' && line[i] != '\t') ++i;
        if (i > b) w.push_back(line.substr(b, i - b));
    }
    return w;
}

}  // namespace

Trace parse_swf(const std::string& input, const std::string& source, long long procs_per_node) {
    if (procs_per_node < 1) {
        throw ConfigError(
            fmt::format("--procs-per-node: {} is not a whole number >= 1", procs_per_node));
    }
    Trace t;
    t.source = source;
    t.device_unit = "nodes";
    std::string text = input;
    if (text.compare(0, 3, "\xEF\xBB\xBF") == 0) {
        text.erase(0, 3);
        t.notes.push_back(fmt::format("{}:1: a UTF-8 byte-order mark, skipped", source));
    }
    long long max_nodes = 0, max_procs = 0;
    int max_procs_line = 0, max_nodes_line = 0;
    long long over_max = 0;  // job fields over MaxProcs or MaxNodes
    std::string first_over;
    double unix_start = 0;
    long long zero_length = 0, unknown_run = 0, unknown_size = 0, cancelled = 0, missing_dep = 0,
              dependent = 0;
    std::map<long long, size_t> by_number;           // job number -> index in t.jobs
    std::set<long long> skipped;                     // job numbers left out
    std::vector<std::pair<size_t, long long>> deps;  // (job, preceding job number)
    int line_no = 0;
    for (const auto& raw : split_lines(text)) {
        ++line_no;
        const std::string where = fmt::format("{}:{}", source, line_no);
        const std::string line = trim(raw);
        if (line.empty()) continue;
        if (line[0] == ';') {
            const size_t colon = line.find(':');
            if (colon == std::string::npos) continue;  // a comment
            const std::string key = trim(line.substr(1, colon - 1));
            const std::string value = trim(line.substr(colon + 1));
            if (key != "MaxNodes" && key != "MaxProcs" && key != "UnixStartTime") continue;
            if (!t.jobs.empty() || !skipped.empty()) {
                throw DataError(fmt::format(
                    "{}: header {} after the first job: the header comes before the jobs", where,
                    key));
            }
            if (key == "MaxNodes") {
                max_nodes = header_count(value, key, where);
                max_nodes_line = line_no;
            } else if (key == "MaxProcs") {
                max_procs = header_count(value, key, where);
                max_procs_line = line_no;
            } else if (!parse_double(value, &unix_start) || unix_start < 0) {
                throw DataError(fmt::format("{}: header UnixStartTime: '{}' is not seconds >= 0",
                                            where, printable(value)));
            }
            continue;
        }
        const auto w = words(line);
        if (w.size() != 18) {
            throw DataError(fmt::format(
                "{}: {} fields, but an SWF job line has 18 (job number, submit time, wait time, "
                "run time, allocated processors, ..., preceding job number, think time)",
                where, w.size()));
        }
        SwfField f[19];
        for (int k = 1; k <= 18; ++k) f[k] = field(w[size_t(k - 1)], k, where);
        const long long number = (long long)f[1].v;
        if (!f[1].known()) {
            throw DataError(
                fmt::format("{}: field 1 (job number): -1, but every job needs one", where));
        }
        if (!f[2].known()) {
            throw DataError(fmt::format(
                "{}: field 2 (submit time): -1, but the simulator needs every job's submit time",
                where));
        }
        if (by_number.count(number) || skipped.count(number)) {
            throw DataError(
                fmt::format("{}: field 1 (job number): job {} appears twice", where, number));
        }
        // The header disagrees with the job: a warning (real logs do this:
        // Theta's 2023 log has 8 jobs of up to 4,389 nodes under MaxProcs
        // 4360); the job is kept, and rejected if larger than the cluster.
        for (int k : {5, 8}) {
            const long long nodes = (long long)std::ceil(f[k].v / double(procs_per_node));
            if (max_procs > 0 && f[k].v > double(max_procs)) {
                if (over_max++ == 0) {
                    first_over = fmt::format(
                        "{}: field {} ({}): {} processors, more than the header's MaxProcs {} "
                        "({}:{})",
                        where, k, kFields[k - 1], (long long)f[k].v, max_procs, source,
                        max_procs_line);
                }
            } else if (max_nodes > 0 && nodes > max_nodes && over_max++ == 0) {
                first_over = fmt::format(
                    "{}: field {} ({}): {} processors, {} nodes of {}, more than the header's "
                    "MaxNodes {} ({}:{})",
                    where, k, kFields[k - 1], (long long)f[k].v, nodes, procs_per_node, max_nodes,
                    source, max_nodes_line);
            }
        }
        const double procs = f[5].v > 0 ? f[5].v : f[8].v;
        const int status = int(f[11].v);
        if (status > 5) {
            throw DataError(fmt::format(
                "{}: field 11 (status): {} is not one the archive defines (-1, 0 failed, 1 "
                "completed, 2-4 checkpointed parts, 5 cancelled)",
                where, status));
        }
        // Jobs that cannot be replayed: counted, left out.
        auto skip = [&](long long& count) {
            ++count;
            skipped.insert(number);
        };
        if (status == 5 && (f[4].v <= 0 || procs <= 0)) {
            skip(cancelled);  // cancelled before it started
            continue;
        }
        if (f[4].v == 0) {
            skip(zero_length);
            continue;
        }
        if (!f[4].known()) {
            skip(unknown_run);
            continue;
        }
        if (procs <= 0) {
            skip(unknown_size);
            continue;
        }
        JobSpec j;
        j.id = std::to_string(number);
        j.where = where;
        j.submit = f[2].v;
        j.devices = (long long)std::ceil(procs / double(procs_per_node));
        j.runtime = f[4].v;
        j.checkpoint_s = 0;  // a recorded run: replayed as it ran, no checkpoint costs
        // The user's estimate; a run past it is what the record says happened.
        if (f[9].v > 0) j.time_limit = std::max(f[9].v, f[4].v);
        if (f[3].known()) {
            j.recorded_start = f[2].v + f[3].v;
            j.recorded_end = j.recorded_start + f[4].v;
        }
        j.state = status == 1   ? "completed"
                  : status == 0 ? "failed"
                  : status == 5 ? "cancelled"
                                : "";
        if (f[12].known()) j.user = fmt::format("{}", (long long)f[12].v);
        if (f[13].known()) j.account = fmt::format("group{}", (long long)f[13].v);
        if (f[17].known()) {
            if ((long long)f[17].v == number) {
                throw DataError(
                    fmt::format("{}: field 17 (preceding job number): job {} cannot follow itself",
                                where, number));
            }
            deps.emplace_back(t.jobs.size(), (long long)f[17].v);
            j.think_s = f[18].known() ? f[18].v : 0;
        }
        by_number[number] = t.jobs.size();
        t.jobs.push_back(std::move(j));
    }
    for (const auto& [k, before] : deps) {
        if (by_number.count(before)) {
            t.jobs[k].after = std::to_string(before);
            ++dependent;
        } else if (!skipped.count(before)) {
            ++missing_dep;
        }
    }
    // Times from the first submission; the record keeps its own epoch.
    double origin = kNever;
    for (const auto& j : t.jobs) origin = std::min(origin, j.submit);
    if (t.jobs.empty()) origin = 0;
    t.origin_epoch = unix_start + origin;
    for (auto& j : t.jobs) {
        j.submit -= origin;
        if (j.recorded_start >= 0) j.recorded_start -= origin, j.recorded_end -= origin;
    }
    t.max_nodes = max_nodes > 0 ? max_nodes : (max_procs + procs_per_node - 1) / procs_per_node;
    auto note = [&](long long n, const char* what) {
        if (n > 0) t.notes.push_back(fmt::format("{}: {} {}", source, n, what));
    };
    if (over_max > 0) {
        t.notes.push_back(fmt::format(
            "warning: {} (and {} more fields over the header): such jobs are rejected unless "
            "--gpus gives a larger cluster",
            first_over, over_max - 1));
    }
    note(zero_length, "jobs with a run time of 0 skipped (counted, not replayed)");
    note(cancelled, "jobs cancelled before they started skipped");
    note(unknown_run, "jobs with an unknown run time (-1) skipped");
    note(unknown_size, "jobs with unknown processors (-1 allocated and requested) skipped");
    note(dependent, "jobs wait for a preceding job (field 17) and its think time");
    note(missing_dep, "preceding jobs not in the log: those dependencies ignored");
    if (t.jobs.empty() && skipped.empty()) {
        throw DataError(fmt::format("{}: no job lines", source));
    }
    return t;
}

}  // namespace apiary::sim
