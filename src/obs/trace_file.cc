#include "obs/trace_file.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "core/error.h"

namespace apiary::obs {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Microseconds with nanosecond digits: nested spans keep their order.
json micros(int64_t ns) { return json(double(ns) / 1000.0); }

json event_json(const core::trace::Event& e, int pid, int tid, int64_t sync_ns) {
    json args = json::object();
    if (e.layer >= 0) args["layer"] = e.layer;
    if (e.bytes >= 0) args["bytes"] = e.bytes;
    if (e.detail) args["algorithm"] = e.detail;
    if (e.tag) args["tag"] = e.tag;
    if (e.id >= 0) args[e.kind == core::trace::Kind::step ? "step" : "id"] = e.id;
    std::string name = e.name;
    if (e.layer >= 0) name += fmt::format(" {}", e.layer);
    return {{"name", name},
            {"cat", core::trace::kind_name(e.kind)},
            {"ph", "X"},
            {"ts", micros(e.begin_ns - sync_ns)},
            {"dur", micros(e.end_ns - e.begin_ns)},
            {"pid", pid},
            {"tid", tid},
            {"args", args}};
}

void write_atomically(const std::string& path, const std::string& text) {
    fs::create_directories(fs::path(path).parent_path());
    const std::string tmp = path + ".tmp";
    {
        std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
        out << text;
        out.flush();
        if (!out) throw IoError(fmt::format("{}: cannot write (disk full?)", tmp));
    }
    fs::rename(tmp, path);
}

[[noreturn]] void bad(const std::string& path, const std::string& what) {
    throw DataError(fmt::format("{}: {}", path, what));
}

int64_t ns_of(const json& v) { return int64_t(std::llround(v.get<double>() * 1000.0)); }

TraceSpan span_of(const json& e, const std::string& path, size_t index) {
    auto need = [&](const char* key, bool number) -> const json& {
        if (!e.contains(key) || (number ? !e[key].is_number() : !e[key].is_string())) {
            bad(path, fmt::format("event {} has no {} field '{}' (not an apiary trace event)",
                                  index, number ? "numeric" : "string", key));
        }
        return e[key];
    };
    TraceSpan s;
    s.name = need("name", false).get<std::string>();
    s.kind = core::trace::kind_from_name(e.value("cat", "other"));
    s.tid = need("tid", true).get<int>();
    s.begin_ns = ns_of(need("ts", true));
    const int64_t dur = ns_of(need("dur", true));
    if (dur < 0) bad(path, fmt::format("event {} ('{}') has a negative duration", index, s.name));
    s.end_ns = s.begin_ns + dur;
    if (e.contains("args") && e["args"].is_object()) {
        const json& a = e["args"];
        s.layer = a.value("layer", -1);
        s.bytes = a.value("bytes", int64_t(-1));
        s.id = a.contains("step") ? a.value("step", int64_t(-1)) : a.value("id", int64_t(-1));
        s.algorithm = a.value("algorithm", "");
        s.tag = a.value("tag", "");
    }
    return s;
}

}  // namespace

void write_trace_file(const std::string& path, const TraceMeta& m,
                      const std::vector<core::trace::ThreadEvents>& threads) {
    json events = json::array();
    events.push_back({{"name", "process_name"},
                      {"ph", "M"},
                      {"pid", m.rank},
                      {"args",
                       {{"name", m.host.empty() ? fmt::format("rank {}", m.rank)
                                                : fmt::format("rank {} ({})", m.rank, m.host)}}}});
    events.push_back({{"name", "process_sort_index"},
                      {"ph", "M"},
                      {"pid", m.rank},
                      {"args", {{"sort_index", m.rank}}}});
    for (const auto& t : threads) {
        events.push_back({{"name", "thread_name"},
                          {"ph", "M"},
                          {"pid", m.rank},
                          {"tid", t.tid},
                          {"args", {{"name", t.name}}}});
        for (const auto& e : t.events) events.push_back(event_json(e, m.rank, t.tid, m.sync_ns));
    }
    json doc = {{"traceEvents", events},
                {"displayTimeUnit", "ms"},
                {"otherData",
                 {{"apiary_trace", 1},
                  {"rank", m.rank},
                  {"world_size", m.world_size},
                  {"first_step", m.first_step},
                  {"last_step", m.last_step},
                  {"sync_monotonic_ns", m.sync_ns},
                  {"sync_unix_ns", m.sync_unix_ns},
                  {"run", m.run},
                  {"host", m.host}}}};
    write_atomically(path, doc.dump());
}

RankTrace read_trace(const std::string& path) {
    // Read whole and parsed in memory: a device (endless) or a file far
    // larger than any rank writes is refused first.
    std::error_code ec;
    const auto st = fs::status(path, ec);
    if (fs::exists(st) && !fs::is_regular_file(st)) {
        bad(path, "not a regular file (a device, pipe or directory, or a symlink to one)");
    }
    if (const uint64_t size = fs::exists(st) ? fs::file_size(path, ec) : 0;
        !ec && size > kMaxTraceFileBytes) {
        bad(path, fmt::format("{} bytes, more than the {} bytes a rank's trace may have (trace "
                              "fewer steps, profile.steps); not an apiary trace, or damaged",
                              size, kMaxTraceFileBytes));
    }
    std::ifstream in(path, std::ios::binary);
    if (!in) throw IoError(fmt::format("{}: cannot open for reading", path));
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    json doc;
    try {
        doc = json::parse(text);
    } catch (const json::parse_error& e) {
        bad(path, fmt::format("not a complete trace ({} bytes; JSON error at byte {}: {}); the "
                              "rank may have stopped while writing it: trace the run again, or "
                              "move the file away",
                              text.size(), e.byte, e.what()));
    }
    if (!doc.is_object() || !doc.contains("traceEvents") || !doc["traceEvents"].is_array() ||
        !doc.contains("otherData") || !doc["otherData"].contains("apiary_trace")) {
        bad(path, "not an apiary trace (needs traceEvents and otherData.apiary_trace)");
    }
    RankTrace t;
    t.path = path;
    const json& o = doc["otherData"];
    try {
        t.meta.rank = o.at("rank").get<int>();
        t.meta.world_size = o.at("world_size").get<int>();
        t.meta.first_step = o.at("first_step").get<int64_t>();
        t.meta.last_step = o.at("last_step").get<int64_t>();
        t.meta.sync_ns = o.at("sync_monotonic_ns").get<int64_t>();
        t.meta.sync_unix_ns = o.at("sync_unix_ns").get<int64_t>();
        t.meta.run = o.value("run", "");
        t.meta.host = o.value("host", "");
    } catch (const json::exception& e) {
        bad(path, fmt::format("otherData is incomplete ({})", e.what()));
    }
    const json& events = doc["traceEvents"];
    for (size_t i = 0; i < events.size(); ++i) {
        const json& e = events[i];
        if (!e.is_object() || !e.contains("ph")) bad(path, fmt::format("event {} has no 'ph'", i));
        const std::string ph = e["ph"].get<std::string>();
        if (ph == "M" && e.value("name", "") == "thread_name") {
            t.threads[e.value("tid", 0)] = e["args"].value("name", "");
        } else if (ph == "X") {
            t.spans.push_back(span_of(e, path, i));
        }
    }
    std::sort(t.spans.begin(), t.spans.end(), [](const TraceSpan& a, const TraceSpan& b) {
        return a.begin_ns != b.begin_ns ? a.begin_ns < b.begin_ns : a.end_ns > b.end_ns;
    });
    return t;
}

std::vector<std::string> trace_files(const std::string& run_dir) {
    const fs::path dir = fs::path(run_dir) / "trace";
    if (!fs::is_directory(run_dir)) {
        throw IoError(fmt::format("{}: no such run directory", run_dir));
    }
    std::vector<std::string> out;
    const std::regex re("rank_[0-9]{5}\\.json");
    std::error_code ec;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
        if (std::regex_match(it->path().filename().string(), re))
            out.push_back(it->path().string());
    }
    if (out.empty()) {
        throw IoError(fmt::format(
            "{}: no trace files (trace/rank_NNNNN.json); trace a run with "
            "`--set profile.steps=10-12` (or [profile] steps = \"10-12\" in its config)",
            run_dir));
    }
    std::sort(out.begin(), out.end());
    return out;
}

std::string merge_traces(const std::string& run_dir, const std::string& out) {
    const auto files = trace_files(run_dir);
    json events = json::array();
    json ranks = json::array();
    for (const auto& f : files) {
        const RankTrace t = read_trace(f);  // checks the file before its events are copied
        std::ifstream in(f, std::ios::binary);
        json doc = json::parse(in);
        for (auto& e : doc["traceEvents"]) events.push_back(std::move(e));
        ranks.push_back({{"rank", t.meta.rank},
                         {"host", t.meta.host},
                         {"file", fs::path(f).filename().string()},
                         {"sync_unix_ns", t.meta.sync_unix_ns}});
    }
    const std::string path =
        out.empty() ? (fs::path(run_dir) / "trace" / "merged.json").string() : out;
    json doc = {{"traceEvents", events},
                {"displayTimeUnit", "ms"},
                {"otherData", {{"apiary_merged_trace", 1}, {"ranks", ranks}}}};
    write_atomically(path, doc.dump());
    return path;
}

}  // namespace apiary::obs
