// Runs the built `apiary sim` binary as a user would: a synthetic trace
// through every policy, JSON and per-job output, pictures (rendered by
// rsvg-convert, which fails on malformed SVG), a recorded Slurm log
// replayed, the collective simulation, and the errors users see.

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "../cli_util.h"

namespace {

namespace fs = std::filesystem;
using apiary::testing::run_command;

struct TempDir {
    fs::path path;
    TempDir() {
        path = fs::temp_directory_path() /
               ("apiary-sim-cli-" + std::to_string(::getpid()) + "-" +
                ::testing::UnitTest::GetInstance()->current_test_info()->name());
        fs::create_directories(path);
    }
    ~TempDir() { fs::remove_all(path); }
    std::string operator/(const std::string& f) const { return (path / f).string(); }
};

std::string sim(const std::string& args) { return apiary::testing::apiary_bin() + " sim " + args; }

std::string slurp(const std::string& f) {
    std::ifstream in(f);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
}

std::string data(const std::string& name) {
    return std::string(APIARY_SOURCE_DIR) + "/tests/sim/data/" + name;
}

TEST(SimCli, SyntheticTraceThroughThePolicies) {
    TempDir d;
    auto r =
        run_command(sim("trace --jobs 300 --gpus 64xH100-SXM --load 1.2 --spot-frac 0.2 "
                        "--flexible-frac 0.3 --seed 4 --out " +
                        d / "t.csv"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    std::ofstream(d / "spot.csv") << "hour,spot_nodes,spot_price\n0,4,2\n1,2,2.5\n2,0,3\n";
    r = run_command(sim("cluster --trace " + d / "t.csv" + " --gpus 64xH100-SXM --spot-profile " +
                        d / "spot.csv" +
                        " --policies fifo,backfill,twolevel+preempt,backfill+carbon --failures "
                        "--set cluster.mtbf_node_hours=500 --json --jobs-out " +
                        d / "jobs.csv"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto j = nlohmann::json::parse(r.output);
    EXPECT_EQ(j["cluster"]["devices"], 64);
    EXPECT_EQ(j["cluster"]["spot_nodes_max"], 4);
    ASSERT_EQ(j["policies"].size(), 4u);
    for (const auto& p : j["policies"]) {
        for (const char* k : {"mean_wait_s", "p95_wait_s", "utilisation", "cost_usd", "co2_kg",
                              "energy_kwh", "lost_device_hours", "restarts", "events_per_s"}) {
            EXPECT_TRUE(p.contains(k)) << k;
        }
        EXPECT_EQ(p["completed"].get<long long>() + p["timeouts"].get<long long>() +
                      p["rejected"].get<long long>(),
                  300);
        EXPECT_GT(p["node_failures"].get<int>(), 0);
    }
    EXPECT_LT(j["policies"][1]["mean_wait_s"].get<double>(),
              j["policies"][0]["mean_wait_s"].get<double>());
    const std::string csv = slurp(d / "jobs.csv");
    EXPECT_EQ(csv.substr(0, csv.find('\n')),
              "id,policy,state,submit,eligible,start,end,wait_s,run_s,completion_s,restarts,"
              "preemptions,failures,device_hours,lost_device_hours,cost_usd,energy_kwh,co2_kg,"
              "recorded_start,recorded_end,recorded_wait_s,reason");
    EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 1 + 4 * 300);
}

TEST(SimCli, PicturesRender) {
    TempDir d;
    std::ofstream(d / "t.csv") << "id,submit,devices,runtime,priority\n"
                                  "a,0,8,3600,0\nb,60,16,1800,1\nc,120,4,600,0\nd,130,2,7200,0\n";
    auto r = run_command(sim("cluster --trace " + d / "t.csv" + " --gpus 16xA100-80GB --svg " +
                             d / "c.svg --series-out " + d / "s.csv"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    // fifo: a starts at 0 (8 busy), b waits for 16, c and d queue behind it.
    const std::string series = slurp(d / "s.csv");
    EXPECT_EQ(series.substr(0, series.find('\n')),
              "policy,t,busy_devices,available_devices,queued_jobs");
    EXPECT_NE(series.find("\nfifo,0,8,16,0\n"), std::string::npos) << series;
    EXPECT_NE(series.find("\nfifo,60,8,16,1\n"), std::string::npos) << series;
    const std::string svg = slurp(d / "c.svg");
    EXPECT_EQ(svg.rfind("<?xml", 0), 0u);
    EXPECT_NE(svg.find("policies side by side"), std::string::npos);
    EXPECT_NE(svg.find("<rect"), std::string::npos);
    r = run_command(
        sim("cluster --trace " + d / "t.csv" + " --gpus 16xA100-80GB --svg " + d / "c.png"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(slurp(d / "c.png").substr(1, 3), "PNG");
    r =
        run_command(sim("comm --gpus 64xH100-SXM --job 32:all-reduce:256MiB --job "
                        "16:all-to-all:64MiB --svg " +
                        d / "m.png"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(slurp(d / "m.png").substr(1, 3), "PNG");
    r = run_command(
        sim("cluster --trace " + d / "t.csv" + " --gpus 16xA100-80GB --svg " + d / "c.gif"));
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.output.find("must end in .svg or .png"), std::string::npos) << r.output;
}

// Slurm's own log of a real run under sched/backfill, replayed under the
// policy and cluster of its slurm.conf (the live Slurm test is
// sim_slurm_replay, label slow).
TEST(SimCli, ReplaysARecordedSlurmLog) {
    auto r = run_command(sim("cluster --trace " + data("backfill_jobcomp.txt") + " --slurm-conf " +
                             data("backfill.conf") + " --json"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    auto j = nlohmann::json::parse(r.output);
    EXPECT_EQ(j["cluster"]["devices"], 4);
    ASSERT_TRUE(j["replay"].contains("backfill"));
    const auto& b = j["replay"]["backfill"];
    EXPECT_EQ(b["compared"], 8);
    EXPECT_TRUE(b["same_start_order"].get<bool>());
    EXPECT_TRUE(b["same_end_order"].get<bool>());
    EXPECT_LE(b["max_start_err_s"].get<double>(), 1.0);
    // The same record under FIFO: job 2 blocks jobs 3, 5 and 7.
    r = run_command(sim("cluster --trace " + data("backfill_jobcomp.txt") + " --slurm-conf " +
                        data("backfill.conf") + " --policies fifo --json"));
    j = nlohmann::json::parse(r.output);
    EXPECT_FALSE(j["replay"]["fifo"]["same_start_order"].get<bool>());
}

// An SWF log, plain and gzipped: the header sizes the cluster, skipped jobs
// are counted, FIFO reproduces its recorded waits job by job, and the
// capacity a log implies is written out.
TEST(SimCli, ReplaysAnSwfLog) {
    TempDir d;
    ASSERT_EQ(run_command("gzip -c " + data("small.swf") + " > " + d / "small.swf.gz").exit_code,
              0);
    for (const std::string& f : {data("small.swf"), d / "small.swf.gz"}) {
        auto r = run_command(sim("cluster --trace " + f + " --policies fifo,multifactor --json " +
                                 "--jobs-out " + d / "jobs.csv"));
        ASSERT_EQ(r.exit_code, 0) << r.output;
        const auto j = nlohmann::json::parse(r.output);
        EXPECT_EQ(j["cluster"]["nodes"], 4);
        EXPECT_EQ(j["trace"]["jobs"], 4);
        const std::string notes = j["trace"]["notes"].dump();
        EXPECT_NE(notes.find("1 jobs with a run time of 0 skipped"), std::string::npos) << notes;
        EXPECT_NE(notes.find("1 jobs cancelled before they started skipped"), std::string::npos);
        const std::string csv = slurp(d / "jobs.csv");
        std::istringstream in(csv);
        std::string line;
        std::getline(in, line);
        int fifo_rows = 0;
        while (std::getline(in, line)) {
            std::vector<std::string> c;
            std::stringstream ss(line);
            for (std::string x; std::getline(ss, x, ',');) c.push_back(x);
            ASSERT_GE(c.size(), 21u) << line;
            if (c[1] != "fifo") continue;
            ++fifo_rows;
            EXPECT_EQ(c[7], c[20]) << "wait_s against recorded_wait_s: " << line;
        }
        EXPECT_EQ(fifo_rows, 4);
    }
    // Job 6 waits 10 s with 4 nodes free (its think time): an outage once
    // gaps of 3.6 s count, none at the default 2 h.
    auto r = run_command(sim("cluster --trace " + data("small.swf") +
                             " --policies fifo --capacity implied --implied-gap-hours 0.001 "
                             "--capacity-out " +
                             d / "cap.csv"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(slurp(d / "cap.csv"), "time,available_nodes\n0,4\n160,0\n170,4\n");
    EXPECT_NE(r.output.find("implied by the log: 1 outages"), std::string::npos) << r.output;
    r = run_command(sim("cluster --trace " + data("small.swf") +
                        " --policies fifo --capacity implied --capacity-out " + d / "cap.csv"));
    EXPECT_EQ(slurp(d / "cap.csv"), "time,available_nodes\n0,4\n");
    // A capacity file: 2 nodes from t = 0, so job 1 (4 nodes) can never start.
    std::ofstream(d / "two.csv") << "time,available_nodes\n0,2\n500,4\n";
    r = run_command(sim("cluster --trace " + data("small.swf") + " --policies fifo --capacity " +
                        d / "two.csv" + " --json"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_GT(nlohmann::json::parse(r.output)["policies"][0]["mean_wait_s"].get<double>(), 400);
}

TEST(SimCli, SwfCapacityAndPriorityErrorsNameWhatAndWhere) {
    TempDir d;
    std::ofstream(d / "bad.swf") << "; MaxNodes: 4\n1 0 0 10 8 -1 -1 1 -1 -1 1 1 1 -1 -1 -1 -1\n";
    auto r = run_command(sim("cluster --trace " + d / "bad.swf"));
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.output.find(d / "bad.swf" + ":2: 17 fields"), std::string::npos) << r.output;
    r = run_command(
        sim("cluster --trace " + data("small.swf") + " --priority-weights age=1000,sise=3"));
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.output.find("--priority-weights: unknown factor 'sise'"), std::string::npos)
        << r.output;
    r = run_command(sim("cluster --trace " + data("small.swf") + " --priority-weights age=-1"));
    EXPECT_NE(r.output.find("--priority-weights: 'age=-1' is not factor=weight"), std::string::npos)
        << r.output;
    std::ofstream(d / "cap.csv") << "time,available_nodes\n0,4\n10,many\n";
    r = run_command(sim("cluster --trace " + data("small.swf") + " --capacity " + d / "cap.csv"));
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.output.find(d / "cap.csv" + ":3: field 'available_nodes': 'many'"),
              std::string::npos)
        << r.output;
    std::ofstream(d / "nowait.swf") << "1 0 -1 10 1 -1 -1 1 -1 -1 1 1 1 -1 -1 -1 -1 -1\n";
    r = run_command(sim("cluster --trace " + d / "nowait.swf" + " --gpus 4 --capacity implied"));
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.output.find("--capacity implied: " + d / "nowait.swf" + " records no starts"),
              std::string::npos)
        << r.output;
    std::ofstream(d / "lim.csv") << "kind,name,max_running_jobs,max_nodes\nuser,7,two,\n";
    r = run_command(sim("cluster --trace " + data("small.swf") + " --limits " + d / "lim.csv"));
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.output.find(d / "lim.csv" + ":2: field 'max_running_jobs': 'two'"),
              std::string::npos)
        << r.output;
    r = run_command(sim("cluster --trace " + data("small.swf") + " --bf-max-job-test 0"));
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.output.find("--bf-max-job-test"), std::string::npos) << r.output;
    // Limits and reservation depth through the binary: user 1 may run one
    // job at a time, so job 3 (user 1) waits for job 1 as it did anyway.
    std::ofstream(d / "one.csv") << "kind,name,max_running_jobs,max_nodes\nuser,1,1,\n";
    r = run_command(sim("cluster --trace " + data("small.swf") + " --limits " + d / "one.csv" +
                        " --policies multifactor,wfp --bf-max-job-test 5 --json"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(nlohmann::json::parse(r.output)["policies"].size(), 2u);
    std::ofstream(d / "prio.conf") << "PriorityType=priority/multifactor\nPriorityWeightAge=x\n";
    r = run_command(
        sim("cluster --trace " + data("small.swf") + " --slurm-conf " + d / "prio.conf"));
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.output.find(d / "prio.conf" + ":2: PriorityWeightAge=x"), std::string::npos)
        << r.output;
}

// Jobs given as a model and a layout: the planner times them, and one
// that does not fit in memory is rejected with its reason.
// CSV cells of one line (no quotes in these files).
std::vector<std::string> cells(const std::string& line) {
    std::vector<std::string> c;
    std::stringstream ss(line);
    for (std::string x; std::getline(ss, x, ',');) c.push_back(x);
    return c;
}

// A log recorded under FIFO (a synthetic trace, its FIFO starts written in
// as recorded_start) is fitted back to FIFO on its first half, and the rest
// then matches the record exactly; the same run twice gives the same
// report; a log without recorded starts is refused.
TEST(SimCli, FitRecoversFifoFromItsOwnLog) {
    TempDir d;
    const std::string gpus = " --gpus 64xH100-SXM";
    auto r =
        run_command(sim("trace --jobs 300 --load 1.1 --accounts 1 --high-priority-frac 0 "
                        "--seed 5 --out " +
                        d / "t.csv" + gpus));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    r = run_command(sim("cluster --trace " + d / "t.csv" + gpus + " --policies fifo --jobs-out " +
                        d / "j.csv"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    std::istringstream trace(slurp(d / "t.csv")), jobs(slurp(d / "j.csv"));
    std::string line, row;
    std::getline(trace, line);
    std::getline(jobs, row);
    std::ofstream rec(d / "rec.csv");
    rec << line << ",recorded_start\n";
    while (std::getline(trace, line) && std::getline(jobs, row)) {
        const auto t = cells(line), j = cells(row);
        ASSERT_EQ(t[0], j[0]);
        rec << line << "," << j[5] << "\n";  // start
    }
    rec.close();
    const std::string fit = sim("fit --trace " + d / "rec.csv" + gpus + " --json --jobs-out ");
    r = run_command(fit + d / "fit1.csv");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    auto j = nlohmann::json::parse(r.output);
    EXPECT_EQ(j["fit"]["chosen"], "--policies fifo");
    EXPECT_GT(j["fit"]["tried"].size(), 20u);
    const auto all = j["rest"][0];
    EXPECT_EQ(all["group"], "all");
    EXPECT_GT(all["jobs"].get<int>(), 100);
    EXPECT_DOUBLE_EQ(all["mean_wait_s"].get<double>(), all["recorded_mean_wait_s"].get<double>());
    EXPECT_DOUBLE_EQ(all["p90_wait_s"].get<double>(), all["recorded_p90_wait_s"].get<double>());
    EXPECT_DOUBLE_EQ(all["spearman_wait"].get<double>(), 1.0);
    EXPECT_EQ(j["rest"][1]["group"], "nodes 1") << j["rest"].dump();
    // --jobs-out: the recorded wait beside the simulated one, equal here.
    std::istringstream out(slurp(d / "fit1.csv"));
    std::getline(out, line);
    EXPECT_NE(line.find("wait_s"), std::string::npos);
    EXPECT_NE(line.find("recorded_wait_s"), std::string::npos);
    int rows = 0;
    while (std::getline(out, line)) {
        const auto c = cells(line);
        ASSERT_GE(c.size(), 21u) << line;
        EXPECT_EQ(c[7], c[20]) << line;
        ++rows;
    }
    EXPECT_EQ(rows, 300);
    // Deterministic: everything but the search's wall time is the same.
    r = run_command(fit + d / "fit2.csv");
    auto j2 = nlohmann::json::parse(r.output);
    j["fit"].erase("search_s");
    j2["fit"].erase("search_s");
    EXPECT_EQ(j.dump(), j2.dump());
    EXPECT_EQ(slurp(d / "fit1.csv"), slurp(d / "fit2.csv"));
    // Text output names the chosen setting and the targets.
    r = run_command(sim("fit --trace " + d / "rec.csv" + gpus));
    EXPECT_NE(r.output.find("chosen: --policies fifo"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("Spearman met"), std::string::npos) << r.output;
    // Nothing recorded: nothing to fit.
    r = run_command(sim("fit --trace " + d / "t.csv" + gpus));
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.output.find("records no starts"), std::string::npos) << r.output;
    r = run_command(sim("fit --trace " + d / "rec.csv" + gpus + " --policies twolevel"));
    EXPECT_NE(r.output.find("'twolevel' has nothing to fit"), std::string::npos) << r.output;
}

TEST(SimCli, ModelJobsAreTimedByThePlanner) {
    TempDir d;
    std::ofstream(d / "m.csv") << "id,submit,devices,model,tp,pp,global_batch,seq_len,steps\n"
                                  "small,0,64,gpt2-350m,1,1,256,1024,2000\n"
                                  "huge,0,8,gpt3-175b,8,1,8,2048,10\n";
    auto r =
        run_command(sim("cluster --trace " + d / "m.csv" +
                        " --gpus 64xH100-SXM --policies fifo --json --jobs-out " + d / "j.json"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto j = nlohmann::json::parse(r.output);
    ASSERT_EQ(j["rejected"].size(), 1u);
    EXPECT_EQ(j["rejected"][0]["id"], "huge");
    EXPECT_NE(j["rejected"][0]["reason"].get<std::string>().find("does not fit in device memory"),
              std::string::npos);
    const auto jobs = nlohmann::json::parse(slurp(d / "j.json"));
    const auto& small = jobs["fifo"][0];
    // 2000 steps at the planner's step time, from `apiary plan` itself.
    r = run_command(apiary::testing::apiary_bin() +
                    " plan --model gpt2-350m --gpus 64xH100-SXM --global-batch 256 --set "
                    "train.seq_len=1024 --set train.batch_size=1 --json");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const double step = nlohmann::json::parse(r.output)["step_time_s"].get<double>();
    EXPECT_NEAR(small["end"].get<double>() - small["start"].get<double>(), 2000 * step,
                1e-6 * 2000 * step);
}

TEST(SimCli, CommReportsEveryPlacement) {
    const auto r =
        run_command(sim("comm --gpus 256xH100-SXM --set cluster.topology=fat-tree-2to1 "
                        "--job 64:all-reduce:1GiB:ring --job 64:all-to-all:16MiB "
                        "--json"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto j = nlohmann::json::parse(r.output);
    EXPECT_EQ(j["cluster"]["topology"], "fat-tree-2to1");
    ASSERT_EQ(j["results"].size(), 8u);  // 4 placements x 2 jobs
    // Packed on an idle part of the fabric, the ring is the planner's.
    EXPECT_EQ(j["results"][0]["placement"], "packed");
    EXPECT_EQ(j["results"][0]["algo"], "ring");
    // An all-to-all has no algorithm: every rank sends to every other.
    EXPECT_EQ(j["results"][1]["algo"], "direct");
    EXPECT_NEAR(
        j["results"][0]["alone_s"].get<double>() / j["results"][0]["alpha_beta_s"].get<double>(),
        1.0, 1e-9);
}

TEST(SimCli, ErrorsNameWhatAndWhere) {
    TempDir d;
    std::ofstream(d / "bad.csv") << "id,submit,devices,runtime,colour\na,0,1,10,red\n";
    auto r = run_command(sim("cluster --trace " + d / "bad.csv" + " --gpus 8xH100-SXM"));
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.output.find("bad.csv:1: unknown field 'colour'"), std::string::npos) << r.output;
    std::ofstream(d / "ok.csv") << "id,submit,devices,runtime\nbig,0,16,10\nsmall,0,1,10\n";
    r = run_command(sim("cluster --trace " + d / "ok.csv"));
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.output.find("how big is the cluster?"), std::string::npos) << r.output;
    r = run_command(sim("cluster --trace " + d / "ok.csv" + " --gpus 8xH100-SXM"));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("rejected: job 'big' (" + d / "ok.csv" +
                            ":2): needs 16 devices but the cluster has 8 (1 nodes x 8)"),
              std::string::npos)
        << r.output;
    r = run_command(sim("cluster --trace " + d / "ok.csv" + " --gpus 12xH100-SXM"));
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.output.find("not a whole number of nodes of 8 devices"), std::string::npos);
    r = run_command(sim("cluster --trace " + d / "ok.csv" + " --gpus 8xH100-SXM --policies lifo"));
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.output.find("unknown policy 'lifo'"), std::string::npos);
    r = run_command(sim("cluster --trace " + d / "missing.csv" + " --gpus 8xH100-SXM"));
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.output.find("trace: cannot read"), std::string::npos);
    r = run_command(sim("comm --gpus 64xH100-SXM --job 128:all-reduce:1GiB"));
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.output.find("the jobs need 128 devices but the fabric has 64"), std::string::npos)
        << r.output;
    r = run_command(sim("comm --gpus 64xH100-SXM --job 8:allreduce:1GiB"));
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.output.find("--job 8:allreduce:1GiB: unknown collective 'allreduce'"),
              std::string::npos);
    r = run_command(sim("comm --gpus 64xH100-SXM --job 8:all-reduce:lots"));
    EXPECT_NE(r.output.find("'lots' is not a size in bytes"), std::string::npos);
}

// Every option of every `apiary sim` subcommand is in the user guide.
TEST(SimCli, UserGuideListsEveryOption) {
    const std::string guide = slurp(std::string(APIARY_SOURCE_DIR) + "/docs/user-guide.md");
    for (const char* sub : {"cluster", "fit", "comm", "trace"}) {
        const auto r = run_command(sim(std::string(sub) + " --help"));
        ASSERT_EQ(r.exit_code, 0) << r.output;
        size_t pos = 0;
        int options = 0;
        while ((pos = r.output.find("  --", pos)) != std::string::npos) {
            const size_t end = r.output.find_first_of(" \n", pos + 2);
            const std::string opt = r.output.substr(pos + 2, end - pos - 2);
            pos = end;
            ++options;
            if (opt == "--help") continue;
            EXPECT_NE(guide.find(opt), std::string::npos) << "sim " << sub << " " << opt;
        }
        EXPECT_GT(options, 5) << sub;
    }
}

}  // namespace
