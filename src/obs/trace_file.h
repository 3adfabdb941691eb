#pragma once
// Trace files: each rank writes trace/rank_NNNNN.json in the Chrome trace
// format (Perfetto and chrome://tracing open it): one complete ("X") event
// per span, pid = rank, tid = thread, cat = the span's kind, args with the
// layer, the bytes and algorithm of a collective, the step number. Times
// are microseconds since a barrier all ranks left together just before the
// first traced step, so the ranks' files share one time axis (the barrier
// aligns the clocks of different hosts); otherData records the barrier's
// monotonic and wall-clock times.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/trace.h"

namespace apiary::obs {

struct TraceMeta {
    int rank = 0;
    int world_size = 1;
    int64_t first_step = 0, last_step = 0;  // 1-based, inclusive
    int64_t sync_ns = 0;                    // CLOCK_MONOTONIC at the barrier
    int64_t sync_unix_ns = 0;               // wall clock at the barrier
    std::string run;
    std::string host;  // the rank's hostname ("" in traces written before it was recorded)
};

// Writes the file whole or not at all (temporary name, then rename).
void write_trace_file(const std::string& path, const TraceMeta& meta,
                      const std::vector<core::trace::ThreadEvents>& threads);

struct TraceSpan {
    std::string name;
    core::trace::Kind kind = core::trace::Kind::other;
    int tid = 0;
    int64_t begin_ns = 0, end_ns = 0;  // since the barrier
    int layer = -1;
    int64_t bytes = -1;
    int64_t id = -1;
    std::string algorithm, tag;
};

struct RankTrace {
    std::string path;
    TraceMeta meta;
    std::map<int, std::string> threads;  // tid -> name
    std::vector<TraceSpan> spans;        // sorted by begin, longest first
};

// The largest rank trace read_trace accepts (it is parsed in memory).
inline constexpr uint64_t kMaxTraceFileBytes = uint64_t(1) << 30;

// Reads and checks one rank's file; DataError naming the file and what is
// wrong (not JSON, truncated, not an apiary trace, a malformed event).
RankTrace read_trace(const std::string& path);

// The rank files of a run directory (RUN/trace/rank_*.json), in rank order;
// IoError when there are none.
std::vector<std::string> trace_files(const std::string& run_dir);

// All ranks on one timeline: RUN/trace/merged.json (or out). Returns the
// path written.
std::string merge_traces(const std::string& run_dir, const std::string& out = "");

}  // namespace apiary::obs
