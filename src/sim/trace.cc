#include "sim/trace.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <ostream>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/model_spec.h"
#include "sim/text.h"

namespace apiary::sim {

namespace {

// One field of apiary's format: its name, meaning and how a cell sets it.
struct Field {
    TraceField doc;
    std::function<void(JobSpec&, const Cell&)> set;
};

double nonneg(const Cell& c, const char* what) { return cell_number(c, 0, 1e15, what); }
double positive(const Cell& c, const char* what) {
    const double v = cell_number(c, 0, 1e15, what);
    if (v <= 0) throw DataError(cell_message(c, fmt::format("must be > 0 ({})", what)));
    return v;
}

const std::vector<Field>& fields() {
    static const std::vector<Field> f = {
        {{"id", "job name, unique in the trace (default: its ordinal)"},
         [](JobSpec& j, const Cell& c) { j.id = c.text; }},
        {{"submit", "submit time, seconds from the start of the trace (required, >= 0)"},
         [](JobSpec& j, const Cell& c) { j.submit = nonneg(c, "seconds, >= 0"); }},
        {{"devices", "devices the job needs, all at once (required, >= 1)"},
         [](JobSpec& j, const Cell& c) {
             j.devices = (long long)cell_integer(c, 1, 1e9, "a whole number >= 1");
         }},
        {{"runtime", "seconds of work at full speed (or give model + steps/tokens)"},
         [](JobSpec& j, const Cell& c) { j.runtime = positive(c, "seconds"); }},
        {{"time_limit", "the user's run-time estimate in seconds, used by backfill"},
         [](JobSpec& j, const Cell& c) { j.time_limit = positive(c, "seconds"); }},
        {{"priority", "priority class, higher first (default 0)"},
         [](JobSpec& j, const Cell& c) {
             j.priority = int(cell_integer(c, -1e6, 1e6, "a whole number"));
         }},
        {{"account", "account for fair share (default \"default\")"},
         [](JobSpec& j, const Cell& c) { j.account = c.text; }},
        {{"spot", "1: runs on spot capacity at the spot price"},
         [](JobSpec& j, const Cell& c) { j.spot = cell_bool(c); }},
        {{"flexible", "1: its start may move to low-carbon hours (needs deadline)"},
         [](JobSpec& j, const Cell& c) { j.flexible = cell_bool(c); }},
        {{"deadline", "latest completion time of a flexible job, seconds (absolute)"},
         [](JobSpec& j, const Cell& c) { j.deadline = nonneg(c, "seconds, >= 0"); }},
        {{"model", "model preset; the planner then gives step time, memory and checkpoints"},
         [](JobSpec& j, const Cell& c) {
             if (!core::find_preset(c.text)) {
                 throw DataError(cell_message(
                     c, fmt::format("unknown model preset (`apiary config presets` lists them)")));
             }
             j.model = c.text;
         }},
        {{"tp", "tensor-parallel size (default 1)"},
         [](JobSpec& j, const Cell& c) { j.tp = int(cell_integer(c, 1, 1e6, ">= 1")); }},
        {{"pp", "pipeline stages (default 1)"},
         [](JobSpec& j, const Cell& c) { j.pp = int(cell_integer(c, 1, 1e6, ">= 1")); }},
        {{"zero", "ZeRO stage 0-3 (default 0)"},
         [](JobSpec& j, const Cell& c) { j.zero = int(cell_integer(c, 0, 3, "0, 1, 2 or 3")); }},
        {{"micro_batch", "sequences per micro-batch (default 1)"},
         [](JobSpec& j, const Cell& c) { j.micro_batch = int(cell_integer(c, 1, 1e6, ">= 1")); }},
        {{"global_batch", "sequences per optimizer step (default: micro_batch x dp)"},
         [](JobSpec& j, const Cell& c) {
             j.global_batch = (long long)cell_integer(c, 1, 1e12, ">= 1");
         }},
        {{"seq_len", "sequence length (default: the config's train.seq_len)"},
         [](JobSpec& j, const Cell& c) { j.seq_len = int(cell_integer(c, 1, 1e8, ">= 1")); }},
        {{"precision", "fp32, tf32, bf16, fp16 or fp8 (default: train.precision)"},
         [](JobSpec& j, const Cell& c) { j.precision = c.text; }},
        {{"recompute", "none, selective or full (default: parallel.recompute)"},
         [](JobSpec& j, const Cell& c) { j.recompute = c.text; }},
        {{"steps", "optimizer steps to run (with model)"},
         [](JobSpec& j, const Cell& c) { j.steps = positive(c, "steps"); }},
        {{"tokens", "tokens to train on (with model; steps = tokens / (batch x seq))"},
         [](JobSpec& j, const Cell& c) { j.tokens = positive(c, "tokens"); }},
        {{"checkpoint_s", "seconds to write one checkpoint (default: the planner's, or 0)"},
         [](JobSpec& j, const Cell& c) { j.checkpoint_s = nonneg(c, "seconds, >= 0"); }},
        {{"checkpoint_interval_s", "work seconds between checkpoints (default: Young/Daly)"},
         [](JobSpec& j, const Cell& c) { j.checkpoint_interval_s = positive(c, "seconds"); }},
        {{"recorded_start", "when a real scheduler started it, for comparison (s)"},
         [](JobSpec& j, const Cell& c) { j.recorded_start = nonneg(c, "seconds, >= 0"); }},
        {{"recorded_end", "when it ended there (s)"},
         [](JobSpec& j, const Cell& c) { j.recorded_end = nonneg(c, "seconds, >= 0"); }},
        {{"user", "the submitting user, for multifactor fair share and --limits"},
         [](JobSpec& j, const Cell& c) { j.user = c.text; }},
        {{"after", "id of a job this one waits for: it starts only after that job ends"},
         [](JobSpec& j, const Cell& c) { j.after = c.text; }},
        {{"think_s", "with after: seconds after that job's end before this one is eligible"},
         [](JobSpec& j, const Cell& c) { j.think_s = nonneg(c, "seconds, >= 0"); }},
    };
    return f;
}

const Field& field(const std::string& name, const std::string& where) {
    for (const auto& f : fields()) {
        if (name == f.doc.name) return f;
    }
    std::vector<std::string> names;
    for (const auto& f : fields()) names.push_back(f.doc.name);
    const std::string near = closest(name, names);
    throw DataError(fmt::format("{}: unknown field '{}'{} (known: {})", where, printable(name),
                                near.empty() ? "" : fmt::format(", did you mean '{}'?", near),
                                fmt::join(names, ", ")));
}

// Checks a job as a whole once all its fields are read.
void finish_job(JobSpec& j, const std::set<std::string>& given, size_t ordinal) {
    if (!given.count("id")) j.id = std::to_string(ordinal);
    const std::string id = printable(j.id);  // for messages
    for (const char* required : {"submit", "devices"}) {
        if (!given.count(required)) {
            throw DataError(fmt::format("{}: job '{}': field '{}' is missing ({})", j.where, id,
                                        required, field(required, j.where).doc.doc));
        }
    }
    if (j.runtime < 0 && (j.model.empty() || (j.steps <= 0 && j.tokens <= 0))) {
        throw DataError(fmt::format(
            "{}: job '{}': no run time: give 'runtime' (seconds), or 'model' with 'steps' or "
            "'tokens' so the planner can time it",
            j.where, id));
    }
    if (j.flexible && j.deadline < 0) {
        throw DataError(fmt::format(
            "{}: job '{}': 'flexible' needs a 'deadline' (the latest completion time, s)", j.where,
            id));
    }
    if (j.deadline >= 0 && j.deadline < j.submit) {
        throw DataError(fmt::format("{}: job '{}': deadline {} is before its submit time {}",
                                    j.where, id, j.deadline, j.submit));
    }
    if (j.recorded_start >= 0 && j.recorded_start < j.submit) {
        throw DataError(fmt::format("{}: job '{}': recorded_start {} is before its submit time {}",
                                    j.where, id, j.recorded_start, j.submit));
    }
    if (!j.after.empty() && j.after == j.id) {
        throw DataError(
            fmt::format("{}: job '{}': field 'after' names the job itself", j.where, id));
    }
    if (j.recorded_start >= 0 && j.recorded_end >= 0 && j.recorded_end < j.recorded_start) {
        throw DataError(fmt::format("{}: job '{}': recorded_end {} is before recorded_start {}",
                                    j.where, id, j.recorded_end, j.recorded_start));
    }
}

void check_unique(const Trace& t) {
    std::set<std::string> seen;
    for (const auto& j : t.jobs) {
        if (!seen.insert(j.id).second) {
            throw DataError(fmt::format("{}: job id '{}' appears twice", j.where, printable(j.id)));
        }
    }
}

Trace parse_csv(const std::string& text, const std::string& source) {
    Trace t;
    t.source = source;
    std::vector<std::string> header;
    int line_no = 0;
    for (const auto& line : split_lines(text)) {
        ++line_no;
        const std::string where = fmt::format("{}:{}", source, line_no);
        if (is_blank_or_comment(line)) continue;
        auto cells = split_csv(line, where);
        if (header.empty()) {
            for (auto& h : cells) field(h = trim(h), where);  // unknown names fail here
            header = cells;
            continue;
        }
        if (cells.size() != header.size()) {
            throw DataError(fmt::format("{}: {} cells but the header has {} fields ({})", where,
                                        cells.size(), header.size(),
                                        printable(fmt::format("{}", fmt::join(header, ",")), 200)));
        }
        JobSpec j;
        j.where = where;
        std::set<std::string> given;
        for (size_t i = 0; i < cells.size(); ++i) {
            const std::string v = trim(cells[i]);
            if (v.empty()) continue;  // not given: the default, or missing if required
            field(header[i], where).set(j, Cell{v, where, header[i]});
            given.insert(header[i]);
        }
        finish_job(j, given, t.jobs.size() + 1);
        t.jobs.push_back(std::move(j));
    }
    if (header.empty()) throw DataError(fmt::format("{}: no header line and no jobs", source));
    return t;
}

std::string json_text(const nlohmann::json& v) {
    if (v.is_string()) return v.get<std::string>();
    if (v.is_boolean()) return v.get<bool>() ? "1" : "0";
    return v.dump();
}

void add_json_job(Trace& t, const nlohmann::json& o, const std::string& where) {
    if (!o.is_object()) {
        throw DataError(
            fmt::format("{}: expected a JSON object per job, got {}", where, o.type_name()));
    }
    JobSpec j;
    j.where = where;
    std::set<std::string> given;
    for (const auto& [k, v] : o.items()) {
        const Field& f = field(k, where);
        if (v.is_null() || v.is_object() || v.is_array()) {
            throw DataError(
                fmt::format("{}: field '{}': expected a number, string or boolean", where, k));
        }
        f.set(j, Cell{json_text(v), where, k});
        given.insert(k);
    }
    finish_job(j, given, t.jobs.size() + 1);
    t.jobs.push_back(std::move(j));
}

Trace parse_json(const std::string& text, const std::string& source) {
    Trace t;
    t.source = source;
    const size_t first = text.find_first_not_of(" \t\r\n");
    if (first != std::string::npos && text[first] == '[') {
        nlohmann::json a;
        try {
            a = nlohmann::json::parse(text);
        } catch (const nlohmann::json::parse_error& e) {
            throw DataError(fmt::format("{}: not valid JSON: {}", source, e.what()));
        }
        for (size_t i = 0; i < a.size(); ++i) {
            add_json_job(t, a[i], fmt::format("{}: job #{}", source, i + 1));
        }
        return t;
    }
    int line_no = 0;  // JSON lines: one object per line
    for (const auto& line : split_lines(text)) {
        ++line_no;
        if (is_blank_or_comment(line)) continue;
        const std::string where = fmt::format("{}:{}", source, line_no);
        nlohmann::json o;
        try {
            o = nlohmann::json::parse(line);
        } catch (const nlohmann::json::parse_error& e) {
            throw DataError(fmt::format("{}: not valid JSON: {}", where, e.what()));
        }
        add_json_job(t, o, where);
    }
    return t;
}

TraceFormat detect(const std::string& text) {
    const size_t first = text.find_first_not_of(" \t\r\n");
    if (first == std::string::npos) return TraceFormat::csv;
    if (text[first] == '{' || text[first] == '[') return TraceFormat::json;
    if (text.compare(first, 6, "JobId=") == 0) return TraceFormat::jobcomp;
    if (text[first] == ';') return TraceFormat::swf;  // the archive's header
    const std::string line = text.substr(first, text.find('\n', first) - first);
    if (line.find('|') != std::string::npos && line.find("JobID") != std::string::npos) {
        return TraceFormat::sacct;
    }
    // An SWF job line without a header: 18 whitespace-separated numbers.
    std::istringstream words(line);
    int n = 0;
    bool numbers = true;
    for (std::string w; words >> w; ++n) {
        double v = 0;
        numbers &= parse_double(w, &v);
    }
    if (numbers && n == 18) return TraceFormat::swf;
    return TraceFormat::csv;
}

Trace parse_format(const std::string& text, const std::string& source, TraceFormat format,
                   SlurmDevices devices, const ReadOptions& opt);

}  // namespace

TraceFormat parse_trace_format(const std::string& name) {
    if (name == "auto") return TraceFormat::automatic;
    if (name == "csv") return TraceFormat::csv;
    if (name == "json") return TraceFormat::json;
    if (name == "sacct") return TraceFormat::sacct;
    if (name == "jobcomp") return TraceFormat::jobcomp;
    if (name == "swf") return TraceFormat::swf;
    throw ConfigError(fmt::format(
        "--trace-format: unknown format '{}' (known: auto, csv, json, sacct, jobcomp, swf)", name));
}

SlurmDevices parse_slurm_devices(const std::string& name) {
    if (name == "auto") return SlurmDevices::automatic;
    if (name == "cpus") return SlurmDevices::cpus;
    if (name == "gpus") return SlurmDevices::gpus;
    throw ConfigError(
        fmt::format("--slurm-devices: unknown value '{}' (known: auto, cpus, gpus)", name));
}

const std::vector<TraceField>& trace_fields() {
    static const std::vector<TraceField> docs = [] {
        std::vector<TraceField> d;
        for (const auto& f : fields()) d.push_back(f.doc);
        return d;
    }();
    return docs;
}

Trace parse_trace(const std::string& text, const std::string& source, TraceFormat format,
                  SlurmDevices devices) {
    ReadOptions opt;
    opt.devices = devices;
    return parse_trace(text, source, format, opt);
}

Trace parse_trace(const std::string& input, const std::string& source, TraceFormat format,
                  const ReadOptions& opt) {
    const SlurmDevices devices = opt.devices;
    std::string text = input;
    const bool bom = strip_bom(text);
    if (format == TraceFormat::automatic) format = detect(text);
    Trace t;
    with_printable_errors([&] { t = parse_format(text, source, format, devices, opt); });
    if (bom)
        t.notes.insert(t.notes.begin(),
                       fmt::format("{}:1: a UTF-8 byte-order mark, skipped", source));
    return t;
}

namespace {

Trace parse_format(const std::string& text, const std::string& source, TraceFormat format,
                   SlurmDevices devices, const ReadOptions& opt) {
    Trace t;
    switch (format) {
        case TraceFormat::csv:
            t = parse_csv(text, source);
            break;
        case TraceFormat::json:
            t = parse_json(text, source);
            break;
        case TraceFormat::sacct:
            t = parse_sacct(text, source, devices);
            break;
        case TraceFormat::jobcomp:
            t = parse_jobcomp(text, source, devices);
            break;
        case TraceFormat::swf:
            t = parse_swf(text, source, opt.procs_per_node);
            break;
        case TraceFormat::automatic:
            break;
    }
    check_unique(t);
    return t;
}

}  // namespace

Trace read_trace(const std::string& path, TraceFormat format, SlurmDevices devices) {
    ReadOptions opt;
    opt.devices = devices;
    return read_trace(path, format, opt);
}

Trace read_trace(const std::string& path, TraceFormat format, const ReadOptions& opt) {
    std::string text = read_text_file(path, "trace");
    if (is_gzip(text)) text = gunzip(text, path, "trace");
    return parse_trace(text, path, format, opt);
}

double record_latency_s(const Trace& trace) {
    std::vector<double> events, waves;
    for (const auto& j : trace.jobs) {
        events.push_back(j.submit);
        if (j.recorded_start < 0) continue;
        events.push_back(j.recorded_end);
        waves.push_back(j.recorded_start);
    }
    std::sort(events.begin(), events.end());
    std::sort(waves.begin(), waves.end());
    waves.erase(std::unique(waves.begin(), waves.end()), waves.end());
    double sum = 0;
    for (double w : waves) {
        const auto it = std::upper_bound(events.begin(), events.end(), w);
        sum += it == events.begin() ? 0 : w - *(it - 1);
    }
    return waves.empty() ? 0 : sum / double(waves.size());
}

void write_trace_csv(const Trace& trace, std::ostream& out) {
    out << "id,submit,devices,runtime,time_limit,priority,account,spot,flexible,deadline\n";
    for (const auto& j : trace.jobs) {
        out << fmt::format("{},{},{},{},{},{},{},{},{},{}\n", csv_quote(j.id), j.submit, j.devices,
                           j.runtime > 0 ? fmt::format("{}", j.runtime) : "",
                           j.time_limit > 0 ? fmt::format("{}", j.time_limit) : "", j.priority,
                           csv_quote(j.account), j.spot ? 1 : 0, j.flexible ? 1 : 0,
                           j.deadline >= 0 ? fmt::format("{}", j.deadline) : "");
    }
}

}  // namespace apiary::sim
