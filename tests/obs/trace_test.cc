// Spans recorded by core/trace.h, trace files written and read back, and
// the summary's split of a step checked against a hand-built timeline.

#include "core/trace.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/error.h"
#include "obs/trace_file.h"
#include "obs/trace_summary.h"
#include "obs_test_util.h"

namespace apiary::obs {
namespace {

using core::trace::Event;
using core::trace::Kind;
using core::trace::ThreadEvents;
using testing::TempDir;

constexpr int64_t kMs = 1000000;

Event ev(const char* name, Kind kind, int64_t b_ms, int64_t e_ms, int layer = -1) {
    Event e;
    e.name = name;
    e.kind = kind;
    e.begin_ns = b_ms * kMs;
    e.end_ns = e_ms * kMs;
    e.layer = layer;
    if (kind == Kind::comm) {
        e.bytes = 4096;
        e.detail = "ring";
        e.tag = "bucket";
    }
    return e;
}

// One 100 ms step: data 0-5, layer 0 forward 5-25 (a tensor-parallel wait
// 10-15 in it), backward 25-60, a data-parallel wait 60-70 running an
// all-reduce 60-68, optimizer 70-90 with a scalar all-reduce 75-80, idle
// 90-100. A worker thread's all-reduce 30-50 hides behind backward.
std::vector<ThreadEvents> timeline() {
    ThreadEvents main{1, "main", {}};
    main.events = {ev("step", Kind::step, 0, 100),
                   ev("data wait", Kind::data, 0, 5),
                   ev("block forward", Kind::compute, 5, 25, 0),
                   ev("tp wait", Kind::wait, 10, 15),
                   ev("block backward", Kind::compute, 25, 60, 0),
                   ev("dp wait", Kind::wait, 60, 70),
                   ev("all_reduce", Kind::comm, 60, 68),
                   ev("optimizer", Kind::optimizer, 70, 90),
                   ev("all_reduce", Kind::comm, 75, 80)};
    main.events[0].id = 10;
    ThreadEvents worker{2, "comm dp", {ev("all_reduce", Kind::comm, 30, 50)}};
    return {main, worker};
}

RankTrace written(const TempDir& d, int rank, const std::vector<ThreadEvents>& t,
                  const std::string& host = "") {
    TraceMeta m;
    m.rank = rank;
    m.host = host;
    m.world_size = 2;
    m.first_step = 10;
    m.last_step = 10;
    const std::string path = d / ("trace/rank_0000" + std::to_string(rank) + ".json");
    write_trace_file(path, m, t);
    return read_trace(path);
}

TEST(Trace, SpansAreRecordedOnlyWhenOnAndNest) {
    core::trace::take();
    { APIARY_TRACE("off", Kind::compute); }
    EXPECT_TRUE(core::trace::take().empty());
    core::trace::set_on(true);
    {
        APIARY_TRACE("outer", Kind::step);
        { APIARY_TRACE("inner", Kind::compute, 3); }
        std::thread([] { APIARY_TRACE("other thread", Kind::comm); }).join();
    }
    core::trace::set_on(false);
    const auto threads = core::trace::take();
    ASSERT_EQ(threads.size(), 2u);
    const auto& mine = threads[0].events.size() == 2 ? threads[0] : threads[1];
    ASSERT_EQ(mine.events.size(), 2u);
    const Event& inner = mine.events[0];  // recorded when it ends, first
    const Event& outer = mine.events[1];
    EXPECT_STREQ(inner.name, "inner");
    EXPECT_EQ(inner.layer, 3);
    EXPECT_LE(outer.begin_ns, inner.begin_ns);
    EXPECT_GE(outer.end_ns, inner.end_ns);
}

TEST(Trace, FileRoundTripKeepsEverySpan) {
    TempDir d;
    const RankTrace t = written(d, 1, timeline());
    EXPECT_EQ(t.meta.rank, 1);
    EXPECT_EQ(t.meta.first_step, 10);
    ASSERT_EQ(t.spans.size(), 10u);
    EXPECT_EQ(t.threads.at(2), "comm dp");
    EXPECT_EQ(t.spans[0].kind, Kind::step);  // sorted by begin, longest first
    EXPECT_EQ(t.spans[0].id, 10);
    const auto& f = t.spans[2];
    EXPECT_EQ(f.name, "block forward 0");
    EXPECT_EQ(f.layer, 0);
    EXPECT_EQ(f.begin_ns, 5 * kMs);
    EXPECT_EQ(f.end_ns, 25 * kMs);
    bool comm_args = false;
    for (const auto& s : t.spans) {
        if (s.kind == Kind::comm)
            comm_args = s.bytes == 4096 && s.algorithm == "ring" && s.tag == "bucket";
    }
    EXPECT_TRUE(comm_args);
}

TEST(Trace, SummarySplitsTheStep) {
    TempDir d;
    const TraceSummary s = summarize({written(d, 0, timeline())});
    ASSERT_EQ(s.ranks.size(), 1u);
    const PhaseSplit& p = s.ranks[0].second;
    EXPECT_EQ(p.steps, 1);
    EXPECT_NEAR(p.step, 0.100, 1e-9);
    EXPECT_NEAR(p.compute, 0.050, 1e-9);       // 15 forward (less the wait) + 35 backward
    EXPECT_NEAR(p.exposed_comm, 0.020, 1e-9);  // tp 5 + dp 10 + scalars 5
    EXPECT_NEAR(p.data_wait, 0.005, 1e-9);
    EXPECT_NEAR(p.optimizer, 0.015, 1e-9);
    EXPECT_NEAR(p.idle, 0.010, 1e-9);
    EXPECT_NEAR(p.parts(), p.step, 1e-9);
    EXPECT_NEAR(p.comm, 0.033, 1e-9);  // 8 + 5 on the main thread, 20 hidden
    ASSERT_EQ(s.layers.size(), 1u);
    EXPECT_EQ(s.layers[0].name, "block 0");
    EXPECT_NEAR(s.layers[0].compute, 0.050, 1e-9);
    EXPECT_NEAR(s.layers[0].exposed_comm, 0.005, 1e-9);
    EXPECT_NEAR(s.layers[0].comm, 0.020, 1e-9);  // the worker's, started during backward
    const auto doc = nlohmann::json::parse(summary_json(s));
    EXPECT_NEAR(doc["ranks"][0]["parts_s"].get<double>(), 0.1, 1e-9);
    EXPECT_NE(format_summary(s).find("block 0"), std::string::npos);
}

TEST(Trace, SummaryNamesTheBusiestRankAndItsHost) {
    TempDir d;
    // Both steps last 130 ms. Rank 1's backward runs 25-89 and it waits
    // 11 ms for the all-reduce; rank 0's backward ends at 60 and it waits
    // the 40 ms until rank 1 joins.
    const auto step = [](int64_t backward_end) {
        ThreadEvents main{1, "main", {}};
        main.events = {ev("step", Kind::step, 0, 130),
                       ev("data wait", Kind::data, 0, 5),
                       ev("block forward", Kind::compute, 5, 25, 0),
                       ev("tp wait", Kind::wait, 10, 15),
                       ev("block backward", Kind::compute, 25, backward_end, 0),
                       ev("dp wait", Kind::wait, backward_end, 100),
                       ev("all_reduce", Kind::comm, 90, 98),
                       ev("optimizer", Kind::optimizer, 100, 120),
                       ev("all_reduce", Kind::comm, 105, 110)};
        return std::vector<ThreadEvents>{main};
    };
    const auto fast = step(60), slow = step(89);
    const TraceSummary s = summarize({written(d, 0, fast, "hostA"), written(d, 1, slow, "hostB")});
    ASSERT_EQ(s.ranks.size(), 2u);
    EXPECT_EQ(s.hosts, (std::vector<std::string>{"hostA", "hostB"}));
    EXPECT_EQ(s.straggler.rank, 1);
    EXPECT_EQ(s.straggler.host, "hostB");
    EXPECT_EQ(s.straggler.fastest_rank, 0);
    EXPECT_EQ(s.straggler.fastest_host, "hostA");
    // busy: step less exposed comm (rank 0: 130 - 50, rank 1: 130 - 21).
    EXPECT_NEAR(s.straggler.fastest_busy, 0.080, 1e-9);
    EXPECT_NEAR(s.straggler.busy, 0.109, 1e-9);
    EXPECT_NE(format_summary(s).find("slowest rank: 1 on hostB"), std::string::npos)
        << format_summary(s);
    const auto doc = nlohmann::json::parse(summary_json(s));
    EXPECT_EQ(doc["straggler"]["host"], "hostB");
    EXPECT_EQ(doc["ranks"][1]["host"], "hostB");
    // One rank: nobody to be slower than.
    EXPECT_EQ(summarize({written(d, 0, fast)}).straggler.rank, -1);
}

TEST(Trace, TruncatedFileIsNamed) {
    TempDir d;
    written(d, 0, timeline());
    const std::string path = d / "trace/rank_00000.json";
    const std::string text = testing::read_file(path);
    testing::write_file(path, text.substr(0, text.size() / 2));
    try {
        read_trace(path);
        FAIL() << "a truncated trace was read";
    } catch (const DataError& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find(path), std::string::npos) << m;
        EXPECT_NE(m.find("not a complete trace"), std::string::npos) << m;
    }
    EXPECT_THROW(merge_traces(d.path()), DataError);
    EXPECT_FALSE(std::filesystem::exists(d / "trace/merged.json"));
}

TEST(Trace, ATraceThatIsADeviceIsRefusedUnread) {
    TempDir d;
    std::filesystem::create_directories(d / "trace");
    const std::string path = d / "trace/rank_00000.json";
    std::filesystem::create_symlink("/dev/null", path);
    try {
        read_trace(path);
        FAIL() << "a device was read as a trace";
    } catch (const DataError& e) {
        EXPECT_NE(std::string(e.what()).find(path + ": not a regular file"), std::string::npos)
            << e.what();
    }
}

TEST(Trace, ForeignJsonAndMissingFilesAreNamed) {
    TempDir d;
    testing::write_file(d / "trace/rank_00000.json", "{\"traceEvents\": []}");
    EXPECT_THROW(read_trace(d / "trace/rank_00000.json"), DataError);
    EXPECT_THROW(read_trace(d / "trace/rank_00009.json"), IoError);
    TempDir empty;
    try {
        trace_files(empty.path());
        FAIL();
    } catch (const IoError& e) {
        EXPECT_NE(std::string(e.what()).find("profile.steps"), std::string::npos) << e.what();
    }
    EXPECT_THROW(trace_files(empty / "nope"), IoError);
}

TEST(Trace, MergePutsEveryRankOnOneTimeline) {
    TempDir d;
    written(d, 0, timeline());
    written(d, 1, timeline());
    const std::string out = merge_traces(d.path());
    const auto doc = nlohmann::json::parse(testing::read_file(out));
    std::set<int> pids;
    for (const auto& e : doc["traceEvents"]) pids.insert(e["pid"].get<int>());
    EXPECT_EQ(pids, (std::set<int>{0, 1}));
    EXPECT_EQ(doc["otherData"]["ranks"].size(), 2u);
}

}  // namespace
}  // namespace apiary::obs
