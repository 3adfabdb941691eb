// Bad input across every reader of the simulator (issue 22, "Bad input"):
// binary garbage never echoed raw, a UTF-8 byte-order mark in any format,
// ids with commas and quotes surviving a CSV round trip, an SWF header that
// the jobs disagree with, a recorded start before the submission.

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "sim/capacity.h"
#include "sim/cluster_sim.h"
#include "sim/profile.h"
#include "sim/slurm.h"
#include "sim/text.h"
#include "sim/trace.h"
#include "sim_test_util.h"

namespace apiary::sim {
namespace {

using test::error_of;

std::string temp_file(const std::string& name, const std::string& bytes) {
    const auto p = std::filesystem::temp_directory_path() /
                   ("apiary-bad-" + std::to_string(::getpid()) + "-" + name);
    std::ofstream(p, std::ios::binary) << bytes;
    return p.string();
}

bool all_printable(const std::string& s) {
    for (unsigned char c : s) {
        if (c < 0x20 || c >= 0x7f) return false;
    }
    return true;
}

// Random bytes, and random bytes after a plausible first line of each
// format, through every reader: each is refused with a message of printable
// ASCII that names the file.
TEST(SimBadInput, BinaryGarbageIsNeverEchoedRaw) {
    std::mt19937 rng(7);
    const std::vector<std::string> starts = {
        "",
        "id,submit,devices,runtime\n",
        "id,submit,devices,runtime\nx,",
        "[{\"submit\": 0, ",
        "JobID|Submit|Start|End|NCPUS\n",
        "JobID|Submit|Start|End|NCPUS\n1|2024-01-01T00:00:00|",
        "JobId=1 ",
        "; MaxNodes: 8\n1 0 0 10 ",
        "kind,name,max_running_jobs,max_nodes\nuser,",
        "time,available_nodes\n0,",
        "hour,gco2_per_kwh\n0,",
        "NodeName=n1 CPUs=",
    };
    const std::vector<TraceFormat> formats = {TraceFormat::automatic, TraceFormat::csv,
                                              TraceFormat::json,      TraceFormat::sacct,
                                              TraceFormat::jobcomp,   TraceFormat::swf};
    int refused = 0;
    for (int round = 0; round < 40; ++round) {
        std::string junk(size_t(20 + rng() % 200), '\0');
        for (auto& c : junk) c = char(rng() % 256);
        const std::string text = starts[size_t(round) % starts.size()] + junk;
        const std::string path = temp_file("junk", text);
        std::vector<std::string> errors;
        for (auto f : formats) {
            errors.push_back(error_of([&] { read_trace(path, f); }));
        }
        errors.push_back(error_of([&] { read_limits(path); }));
        errors.push_back(error_of([&] {
            CapacityInput in;
            read_capacity_csv(path, in, 0);
        }));
        errors.push_back(error_of([&] { read_profile_table(path, {"gco2_per_kwh"}); }));
        errors.push_back(error_of([&] { read_slurm_conf(path); }));
        for (const auto& e : errors) {
            if (e.empty()) continue;  // garbage that happens to parse (a CSV cell, ...)
            ++refused;
            EXPECT_TRUE(all_printable(e)) << "round " << round << ": " << e;
            EXPECT_NE(e.find(path), std::string::npos) << e;
        }
        std::filesystem::remove(path);
    }
    EXPECT_GT(refused, 300);  // nearly every reader refuses nearly every file
}

// The messages that quote what the file says quote it escaped.
TEST(SimBadInput, QuotedValuesAreEscaped) {
    auto csv = [](const std::string& text) {
        return error_of([&] { parse_trace(text, "g.csv", TraceFormat::csv); });
    };
    EXPECT_NE(csv("id,su\xffmit,devices\n").find("unknown field 'su\\xffmit'"), std::string::npos);
    EXPECT_NE(csv("id,submit,devices,runtime\na\x01,0,1,5\na\x01,0,1,5\n")
                  .find("g.csv:3: job id 'a\\x01' appears twice"),
              std::string::npos);
    EXPECT_NE(csv("id,submit,devices,runtime,recorded_start\n\xfe,10,1,5,4\n")
                  .find("job '\\xfe': recorded_start 4 is before its submit time 10"),
              std::string::npos);
    const std::string jc =
        error_of([] { parse_trace("\x80\x81=2 JobId=1\n", "j.log", TraceFormat::jobcomp); });
    EXPECT_NE(jc.find("j.log:1: '\\x80\\x81=2' is not a jobcomp/filetxt field"), std::string::npos)
        << jc;
    const std::string js =
        error_of([] { parse_trace("[{\"a\": \xff}]", "j.json", TraceFormat::json); });
    EXPECT_TRUE(all_printable(js)) << js;
    EXPECT_NE(js.find("j.json: not valid JSON"), std::string::npos) << js;
}

// A byte-order mark (as Windows editors write) is skipped with a note in
// every trace format, and silently in the other CSV readers.
TEST(SimBadInput, ByteOrderMarkInEveryFormat) {
    const std::string bom = "\xEF\xBB\xBF";
    const std::vector<std::pair<std::string, TraceFormat>> texts = {
        {"id,submit,devices,runtime\na,0,2,10\n", TraceFormat::csv},
        {"[{\"id\": \"a\", \"submit\": 0, \"devices\": 2, \"runtime\": 10}]", TraceFormat::json},
        {"{\"id\": \"a\", \"submit\": 0, \"devices\": 2, \"runtime\": 10}\n", TraceFormat::json},
        {"JobID|Submit|Start|End|NCPUS|State\n"
         "a|2024-01-01T00:00:00|2024-01-01T00:00:00|2024-01-01T00:00:10|2|COMPLETED\n",
         TraceFormat::sacct},
        {"JobId=a UserId=u(1) JobState=COMPLETED TimeLimit=1 SubmitTime=2024-01-01T00:00:00 "
         "StartTime=2024-01-01T00:00:00 EndTime=2024-01-01T00:00:10 NodeCnt=1 ProcCnt=2\n",
         TraceFormat::jobcomp},
        {"; MaxNodes: 4\na 0 0 10 2 -1 -1 2 -1 -1 1 1 1 -1 -1 -1 -1 -1\n", TraceFormat::swf},
    };
    for (const auto& [text, format] : texts) {
        std::string plain = text;
        if (format == TraceFormat::swf) plain.replace(plain.find("\na "), 3, "\n1 ");
        const Trace a = parse_trace(plain, "t", TraceFormat::automatic);
        const Trace b = parse_trace(bom + plain, "t", TraceFormat::automatic);
        ASSERT_EQ(a.jobs.size(), 1u) << plain;
        ASSERT_EQ(b.jobs.size(), 1u) << plain;
        EXPECT_EQ(b.jobs[0].id, a.jobs[0].id);
        EXPECT_EQ(b.jobs[0].devices, 2);
        EXPECT_DOUBLE_EQ(b.jobs[0].runtime, 10);
        ASSERT_FALSE(b.notes.empty()) << plain;
        EXPECT_EQ(b.notes[0], "t:1: a UTF-8 byte-order mark, skipped");
    }
    const Limits l = parse_limits(bom + "kind,name,max_running_jobs,max_nodes\nuser,u,2,\n", "l");
    EXPECT_EQ(l.user.at("u").max_jobs, 2);
    CapacityInput in;
    parse_capacity_csv(bom + "time,available_nodes\n0,3\n", "c", in, 0);
    EXPECT_EQ(capacity_timeline(in, 8).back().nodes, 3);
    const auto p =
        parse_profile_table(bom + "hour,gco2_per_kwh\n0,100\n1,50\n", "p", {"gco2_per_kwh"}, {});
    EXPECT_DOUBLE_EQ(p.values[0][1], 50);
}

// Ids and accounts with commas and quotes survive apiary's CSV: written
// quoted, read back the same.
TEST(SimBadInput, IdsWithCommasAndQuotesRoundTrip) {
    Trace t;
    JobSpec j;
    j.id = "train, \"big\"";
    j.account = "a,b";
    j.submit = 5;
    j.devices = 2;
    j.runtime = 60;
    t.jobs.push_back(j);
    std::ostringstream out;
    write_trace_csv(t, out);
    const Trace back = parse_trace(out.str(), "round.csv", TraceFormat::csv);
    ASSERT_EQ(back.jobs.size(), 1u) << out.str();
    EXPECT_EQ(back.jobs[0].id, j.id);
    EXPECT_EQ(back.jobs[0].account, j.account);
    EXPECT_EQ(back.jobs[0].devices, 2);
}

// SWF: jobs larger than the header's MaxNodes (no MaxProcs) are a warning
// naming the line and field; the job is kept.
TEST(SimBadInput, SwfJobsOverMaxNodesAreAWarning) {
    const Trace t = parse_swf(
        "; MaxNodes: 4\n"
        "1 0 0 10 2 -1 -1 2 -1 -1 1 1 1 -1 -1 -1 -1 -1\n"
        "2 0 0 10 12 -1 -1 12 -1 -1 1 1 1 -1 -1 -1 -1 -1\n",
        "h.swf", 2);
    ASSERT_EQ(t.jobs.size(), 2u);
    EXPECT_EQ(t.jobs[1].devices, 6);
    const std::string notes = fmt::format("{}", fmt::join(t.notes, "\n"));
    EXPECT_NE(notes.find("warning: h.swf:3: field 5 (allocated processors): 12 processors, 6 "
                         "nodes of 2, more than the header's MaxNodes 4 (h.swf:1) (and 1 more "
                         "fields over the header)"),
              std::string::npos)
        << notes;
}

// A recorded start before the submission is an error in every format that
// can say it (SWF cannot: its wait is -1 or >= 0).
TEST(SimBadInput, RecordedStartBeforeSubmitIsAnError) {
    EXPECT_NE(error_of([] {
                  parse_trace("id,submit,devices,runtime,recorded_start\nj,100,1,5,90\n", "r.csv",
                              TraceFormat::csv);
              }).find("r.csv:2: job 'j': recorded_start 90 is before its submit time 100"),
              std::string::npos);
    EXPECT_NE(error_of([] {
                  parse_trace(
                      "JobID|Submit|Start|End|NCPUS\n"
                      "7|2024-01-01T00:01:00|2024-01-01T00:00:00|2024-01-01T00:02:00|1\n",
                      "r.sacct", TraceFormat::sacct);
              }).find("r.sacct:2: job '7': field 'Start' 2024-01-01T00:00:00 is before its Submit"),
              std::string::npos);
    EXPECT_NE(error_of([] {
                  parse_swf("1 0 -3 10 2 -1 -1 2 -1 -1 1 1 1 -1 -1 -1 -1 -1\n", "r.swf", 1);
              }).find("r.swf:1: field 3 (wait time): -3 is negative"),
              std::string::npos);
}

}  // namespace
}  // namespace apiary::sim
