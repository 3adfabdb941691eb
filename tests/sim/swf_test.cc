// The Standard Workload Format reader: all 18 fields, the archive's -1
// conventions, skipped jobs counted, gzip (whole, concatenated, truncated),
// dependencies (preceding job + think time) honoured by the simulator, and
// every kind of bad input named by file, line and field.

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "sim/report.h"
#include "sim/text.h"
#include "sim/trace.h"
#include "sim_test_util.h"

namespace apiary::sim {
namespace {

using test::error_of;

Trace swf(const std::string& text, long long ppn = 1) { return parse_swf(text, "t.swf", ppn); }

const char* kHeader =
    "; Version: 2.2\n"
    "; UnixStartTime: 1000\n"
    "; MaxNodes: 8\n"
    "; MaxProcs: 32\n";

// A gzip member of `text` (zlib's deflate with a gzip wrapper).
std::string gzip(const std::string& text) {
    z_stream z{};
    EXPECT_EQ(deflateInit2(&z, 9, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY), Z_OK);
    std::string out(deflateBound(&z, uLong(text.size())) + 64, '\0');
    z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(text.data()));
    z.avail_in = uInt(text.size());
    z.next_out = reinterpret_cast<Bytef*>(out.data());
    z.avail_out = uInt(out.size());
    EXPECT_EQ(deflate(&z, Z_FINISH), Z_STREAM_END);
    out.resize(z.total_out);
    deflateEnd(&z);
    return out;
}

std::string temp_file(const std::string& name, const std::string& bytes) {
    const auto p = std::filesystem::temp_directory_path() /
                   ("apiary-swf-" + std::to_string(::getpid()) + "-" + name);
    std::ofstream(p, std::ios::binary) << bytes;
    return p.string();
}

TEST(SimSwf, ReadsEveryFieldAndTheArchiveConventions) {
    const Trace t = swf(std::string(kHeader) +
                            // id submit wait run alloc cpu mem req reqtime reqmem status user
                            // group exe queue part prev think
                            "1 100 50 3600 16 -1 -1 16 7200 -1 1 7 2 -1 1 -1 -1 -1\n"
                            "2 110 -1 600 -1 -1 -1 3 500 -1 0 8 -1 -1 -1 -1 1 30\n"
                            "3 120 0 0 4 -1 -1 4 60 -1 1 7 2 -1 -1 -1 -1 -1\n"      // zero length
                            "4 130 -1 -1 -1 -1 -1 4 60 -1 5 7 2 -1 -1 -1 -1 -1\n"   // cancelled
                            "5 140 10 -1 4 -1 -1 4 60 -1 1 7 2 -1 -1 -1 -1 -1\n"    // run unknown
                            "6 150 10 20 -1 -1 -1 -1 60 -1 1 7 2 -1 -1 -1 -1 -1\n"  // size unknown
                            "7 160 5 20 4 -1 -1 4 60 -1 5 7 2 -1 -1 -1 99 -1\n",  // cancelled, ran
                        4);
    EXPECT_EQ(t.max_nodes, 8);  // MaxNodes wins over MaxProcs / procs per node
    EXPECT_EQ(t.device_unit, "nodes");
    EXPECT_DOUBLE_EQ(t.origin_epoch, 1100);
    ASSERT_EQ(t.jobs.size(), 3u);
    const JobSpec& a = t.jobs[0];
    EXPECT_EQ(a.id, "1");
    EXPECT_DOUBLE_EQ(a.submit, 0);
    EXPECT_EQ(a.devices, 4);  // 16 processors, 4 a node
    EXPECT_DOUBLE_EQ(a.runtime, 3600);
    EXPECT_DOUBLE_EQ(a.time_limit, 7200);
    EXPECT_DOUBLE_EQ(a.recorded_start, 50);
    EXPECT_DOUBLE_EQ(a.recorded_end, 3650);
    EXPECT_EQ(a.user, "7");
    EXPECT_EQ(a.account, "group2");
    EXPECT_EQ(a.state, "completed");
    EXPECT_DOUBLE_EQ(a.checkpoint_s, 0);
    const JobSpec& b = t.jobs[1];
    EXPECT_EQ(b.devices, 1);              // requested 3 processors when allocated is -1
    EXPECT_DOUBLE_EQ(b.time_limit, 600);  // ran past its 500 s request: the record wins
    EXPECT_LT(b.recorded_start, 0);       // wait -1: nothing to compare
    EXPECT_EQ(b.account, "default");      // group -1
    EXPECT_EQ(b.after, "1");
    EXPECT_DOUBLE_EQ(b.think_s, 30);
    EXPECT_EQ(t.jobs[2].id, "7");
    EXPECT_EQ(t.jobs[2].state, "cancelled");
    EXPECT_TRUE(t.jobs[2].after.empty());  // job 99 is not in the log
    const std::string notes = fmt::format("{}", fmt::join(t.notes, "\n"));
    EXPECT_NE(notes.find("1 jobs with a run time of 0 skipped"), std::string::npos) << notes;
    EXPECT_NE(notes.find("1 jobs cancelled before they started skipped"), std::string::npos);
    EXPECT_NE(notes.find("1 jobs with an unknown run time (-1) skipped"), std::string::npos);
    EXPECT_NE(notes.find("1 jobs with unknown processors"), std::string::npos);
    EXPECT_NE(notes.find("1 jobs wait for a preceding job"), std::string::npos);
    EXPECT_NE(notes.find("1 preceding jobs not in the log"), std::string::npos);
}

TEST(SimSwf, ClusterSizeFromMaxProcsWhenNoMaxNodes) {
    const Trace t = swf("; MaxProcs: 30\n1 0 0 10 8 -1 -1 8 -1 -1 1 1 1 -1 -1 -1 -1 -1\n", 4);
    EXPECT_EQ(t.max_nodes, 8);  // ceil(30 / 4)
    EXPECT_EQ(t.jobs[0].devices, 2);
    EXPECT_LT(t.jobs[0].time_limit, 0);  // requested time -1: backfill plans with the run time
    EXPECT_EQ(swf("1 0 0 10 8 -1 -1 8 -1 -1 1 1 1 -1 -1 -1 -1 -1\n").max_nodes, 0);
}

TEST(SimSwf, MoreProcessorsThanTheHeaderIsAWarningNamingLineAndField) {
    const Trace t = swf(std::string(kHeader) +
                        "1 0 0 10 40 -1 -1 40 20 -1 1 1 1 -1 -1 -1 -1 -1\n"
                        "2 0 0 10 4 -1 -1 64 20 -1 1 1 1 -1 -1 -1 -1 -1\n");
    ASSERT_EQ(t.jobs.size(), 2u);  // kept: the cluster's size decides
    EXPECT_EQ(t.jobs[0].devices, 40);
    const std::string notes = fmt::format("{}", fmt::join(t.notes, "\n"));
    EXPECT_NE(notes.find("warning: t.swf:5: field 5 (allocated processors): 40 processors, more "
                         "than the header's MaxProcs 32 (t.swf:4) (and 2 more fields over the "
                         "header)"),
              std::string::npos)
        << notes;
}

TEST(SimSwf, ByteOrderMarkIsSkippedWithANote) {
    const Trace t =
        swf("\xEF\xBB\xBF; MaxNodes: 4\n1 0 0 10 1 -1 -1 1 -1 -1 1 1 1 -1 -1 -1 -1 -1\n");
    EXPECT_EQ(t.max_nodes, 4);
    ASSERT_FALSE(t.notes.empty());
    EXPECT_NE(t.notes[0].find("t.swf:1: a UTF-8 byte-order mark"), std::string::npos);
}

TEST(SimSwf, GzipPlainConcatenatedAndTruncated) {
    const std::string text = std::string(kHeader) +
                             "1 0 0 10 4 -1 -1 4 20 -1 1 1 1 -1 -1 -1 -1 -1\n"
                             "2 5 0 10 4 -1 -1 4 20 -1 1 1 1 -1 -1 -1 -1 -1\n";
    const std::string plain = temp_file("plain.swf", text);
    const std::string gz = temp_file("log.swf.gz", gzip(text));
    const Trace a = read_trace(plain, TraceFormat::swf);
    const Trace b = read_trace(gz, TraceFormat::automatic);  // detected after inflating
    ASSERT_EQ(a.jobs.size(), 2u);
    ASSERT_EQ(b.jobs.size(), 2u);
    EXPECT_DOUBLE_EQ(b.jobs[1].submit, a.jobs[1].submit);
    EXPECT_EQ(b.max_nodes, 8);
    // Two gzip members are one file (what `cat a.gz b.gz` gives).
    const std::string cat =
        temp_file("cat.swf.gz",
                  gzip(std::string(kHeader) + "1 0 0 10 4 -1 -1 4 20 -1 1 1 1 -1 -1 -1 -1 -1\n") +
                      gzip("2 5 0 10 4 -1 -1 4 20 -1 1 1 1 -1 -1 -1 -1 -1\n"));
    EXPECT_EQ(read_trace(cat, TraceFormat::swf).jobs.size(), 2u);
    const std::string z = gzip(text);
    const std::string cut = temp_file("cut.swf.gz", z.substr(0, z.size() / 2));
    const std::string e = error_of([&] { read_trace(cut, TraceFormat::swf); });
    EXPECT_NE(e.find(cut + ":"), std::string::npos) << e;
    EXPECT_NE(e.find("truncated gzip stream"), std::string::npos) << e;
    std::string bad = z;
    bad[12] = char(bad[12] ^ 0x5a);
    bad[13] = char(bad[13] ^ 0xa5);
    const std::string corrupt = temp_file("corrupt.swf.gz", bad);
    EXPECT_NE(error_of([&] { read_trace(corrupt, TraceFormat::swf); }).find("gzip"),
              std::string::npos);
    for (const auto& f : {plain, gz, cat, cut, corrupt}) std::filesystem::remove(f);
}

TEST(SimSwf, BadInputNamesFileLineAndField) {
    const std::string ok = "1 0 0 10 4 -1 -1 4 20 -1 1 1 1 -1 -1 -1 -1 -1\n";
    struct Case {
        std::string text, expect;
    };
    const std::vector<Case> cases = {
        {std::string(kHeader) + "1 0 0 10 4 -1 -1 4 20 -1 1 1 1 -1 -1 -1 -1\n",
         "t.swf:5: 17 fields, but an SWF job line has 18"},
        {ok + "2 0 0 ten 4 -1 -1 4 20 -1 1 1 1 -1 -1 -1 -1 -1\n",
         "t.swf:2: field 4 (run time): 'ten' is not a number"},
        {ok + "2 0 -5 10 4 -1 -1 4 20 -1 1 1 1 -1 -1 -1 -1 -1\n",
         "t.swf:2: field 3 (wait time): -5 is negative (the archive allows -1"},
        {ok + "2 0 0 10 4.5 -1 -1 4 20 -1 1 1 1 -1 -1 -1 -1 -1\n",
         "t.swf:2: field 5 (allocated processors): 4.5 is not a whole number"},
        {ok + "2 -1 0 10 4 -1 -1 4 20 -1 1 1 1 -1 -1 -1 -1 -1\n",
         "t.swf:2: field 2 (submit time): -1, but the simulator needs"},
        {ok + "1 0 0 10 4 -1 -1 4 20 -1 1 1 1 -1 -1 -1 -1 -1\n",
         "t.swf:2: field 1 (job number): job 1 appears twice"},
        {ok + "2 0 0 10 4 -1 -1 4 20 -1 9 1 1 -1 -1 -1 -1 -1\n",
         "t.swf:2: field 11 (status): 9 is not one the archive defines"},
        {ok + "2 0 0 10 4 -1 -1 4 20 -1 1 1 1 -1 -1 -1 2 -1\n",
         "t.swf:2: field 17 (preceding job number): job 2 cannot follow itself"},
        {"; MaxNodes: lots\n" + ok, "t.swf:1: header MaxNodes: 'lots' is not a whole number >= 1"},
        {"; MaxProcs: -4\n" + ok, "t.swf:1: header MaxProcs: '-4' is not a whole number >= 1"},
        {ok + "; MaxNodes: 4\n", "t.swf:2: header MaxNodes after the first job"},
        {"; UnixStartTime: yesterday\n" + ok, "t.swf:1: header UnixStartTime: 'yesterday'"},
        {ok + "2 0 0 \x01\xff\xfe 4 -1 -1 4 20 -1 1 1 1 -1 -1 -1 -1 -1\n",
         "t.swf:2: field 4 (run time): '\\x01\\xff\\xfe' is not a number"},
        {"; just a comment\n\n", "t.swf: no job lines"},
    };
    for (const auto& c : cases) {
        const std::string e = error_of([&] { swf(c.text); });
        EXPECT_NE(e.find(c.expect), std::string::npos) << "got: " << e << "\nwant: " << c.expect;
    }
    EXPECT_NE(error_of([&] { swf(ok, 0); }).find("--procs-per-node: 0"), std::string::npos);
}

TEST(SimSwf, JobsCsvQuotesIdsAndCsvErrorsEscapeGarbage) {
    // An id with a comma and a quote stays one cell in --jobs-out.
    std::vector<SimJob> jobs = {test::job("a,\"b\"", 0, 1, 10)};
    jobs[0].spec.recorded_start = 5;
    const SimResult r = simulate(jobs, test::cluster(1, 1), parse_policy("fifo"));
    std::ostringstream out;
    write_jobs_csv(jobs, {r}, out);
    const std::string csv = out.str();
    const std::string row = csv.substr(csv.find('\n') + 1);
    EXPECT_EQ(row.substr(0, 15), "\"a,\"\"b\"\"\",fifo,") << row;
    EXPECT_NE(row.find(",5,\"\"\n"), std::string::npos) << row;  // recorded_wait_s 5, no reason
    const std::string e = error_of([] {
        parse_trace("id,submit,devices,runtime\nx,\x01\xfe,1,10\n", "g.csv", TraceFormat::csv);
    });
    EXPECT_NE(e.find("g.csv:2: field 'submit': '\\x01\\xfe' is not a number"), std::string::npos)
        << e;
}

TEST(SimSwf, PrecedingJobAndThinkTimeHoldTheFollower) {
    // A 1-node cluster is free when b arrives, but b follows a: it starts
    // at a's end (100) + 30 s think time. c has no dependency and starts
    // at once after a; d follows a job left out of the run (rejected).
    auto a = test::job("a", 0, 1, 100);
    auto b = test::job("b", 10, 1, 50);
    b.spec.after = "a";
    b.spec.think_s = 30;
    auto c = test::job("c", 20, 2, 10);  // 2 nodes: waits for a, runs 100..110
    auto big = test::job("big", 0, 99, 10);
    big.reject = "too big";
    auto d = test::job("d", 0, 1, 5);
    d.spec.after = "big";
    std::vector<SimJob> jobs = {a, b, c, big, d};
    const SimConfig cfg = test::cluster(2, 1);
    const SimResult r = simulate(jobs, cfg, parse_policy("fifo"));
    EXPECT_DOUBLE_EQ(r.jobs[0].start, 0);
    EXPECT_DOUBLE_EQ(r.jobs[4].start, 0);    // d: its predecessor never runs, no wait
    EXPECT_DOUBLE_EQ(r.jobs[2].start, 100);  // c needs both nodes
    EXPECT_DOUBLE_EQ(r.jobs[1].eligible, 130);
    EXPECT_DOUBLE_EQ(r.jobs[1].start, 130);  // b: a's end + think time
}

}  // namespace
}  // namespace apiary::sim
