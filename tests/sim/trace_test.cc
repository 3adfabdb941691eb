// The readers: apiary's CSV and JSON traces, Slurm's sacct and jobcomp
// records and slurm.conf, profiles; every kind of bad input gets an error
// naming the file, line and field, or a per-job rejection reason.

#include "sim/trace.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "plan/totals.h"
#include "sim/profile.h"
#include "sim/slurm.h"
#include "sim/text.h"
#include "sim_test_util.h"

namespace apiary::sim {
namespace {

using test::error_of;

Trace csv(const std::string& text) { return parse_trace(text, "t.csv", TraceFormat::csv); }

TEST(SimTrace, CsvAndJsonReadTheSameJobs) {
    const Trace c =
        csv("# a comment\n"
            "id,submit,devices,runtime,time_limit,priority,account,spot,flexible,deadline\n"
            "a,0,8,3600,7200,1,research,0,1,90000\n"
            "\"b,2\",10.5,1,60,,,,true,,\n");
    const Trace j = parse_trace(
        "{\"id\": \"a\", \"submit\": 0, \"devices\": 8, \"runtime\": 3600, \"time_limit\": 7200, "
        "\"priority\": 1, \"account\": \"research\", \"spot\": false, \"flexible\": true, "
        "\"deadline\": 90000}\n"
        "{\"id\": \"b,2\", \"submit\": 10.5, \"devices\": 1, \"runtime\": 60, \"spot\": true}\n",
        "t.jsonl", TraceFormat::automatic);
    const Trace a =
        parse_trace("[{\"id\": \"a\", \"submit\": 0, \"devices\": 8, \"runtime\": 3600}]", "t.json",
                    TraceFormat::automatic);
    ASSERT_EQ(c.jobs.size(), 2u);
    ASSERT_EQ(j.jobs.size(), 2u);
    ASSERT_EQ(a.jobs.size(), 1u);
    for (const Trace* t : {&c, &j}) {
        EXPECT_EQ(t->jobs[0].account, "research");
        EXPECT_EQ(t->jobs[0].priority, 1);
        EXPECT_TRUE(t->jobs[0].flexible);
        EXPECT_DOUBLE_EQ(t->jobs[0].deadline, 90000);
        EXPECT_EQ(t->jobs[1].id, "b,2");
        EXPECT_DOUBLE_EQ(t->jobs[1].submit, 10.5);
        EXPECT_TRUE(t->jobs[1].spot);
        EXPECT_EQ(t->jobs[1].account, "default");
    }
    EXPECT_EQ(c.jobs[0].where, "t.csv:3");
    EXPECT_EQ(j.jobs[1].where, "t.jsonl:2");
}

TEST(SimTrace, BadTracesNameTheLineAndField) {
    const std::string head = "id,submit,devices,runtime\n";
    EXPECT_EQ(
        error_of([&] { csv("id,submit,devices,runtim\n"); }),
        "t.csv:1: unknown field 'runtim', did you mean 'runtime'? (known: id, submit, "
        "devices, runtime, time_limit, priority, account, spot, flexible, deadline, model, "
        "tp, pp, zero, micro_batch, global_batch, seq_len, precision, recompute, steps, "
        "tokens, checkpoint_s, checkpoint_interval_s, recorded_start, recorded_end, user, after, "
        "think_s)");
    EXPECT_EQ(error_of([&] { csv(head + "a,-5,1,10\n"); }),
              "t.csv:2: field 'submit': '-5' is negative (seconds, >= 0)");
    EXPECT_EQ(error_of([&] { csv(head + "a,,1,10\n"); }),
              "t.csv:2: job 'a': field 'submit' is missing (submit time, seconds from the start "
              "of the trace (required, >= 0))");
    EXPECT_EQ(error_of([&] { csv(head + "a,5,1,soon\n"); }),
              "t.csv:2: field 'runtime': 'soon' is not a number (seconds)");
    EXPECT_EQ(error_of([&] { csv(head + "a,5,1.5,10\n"); }),
              "t.csv:2: field 'devices': '1.5' is not a whole number (a whole number >= 1)");
    EXPECT_EQ(error_of([&] { csv(head + "a,5,1\n"); }),
              "t.csv:2: 3 cells but the header has 4 fields (id,submit,devices,runtime)");
    EXPECT_EQ(error_of([&] { csv(head + "a,5,1,10\na,6,1,10\n"); }),
              "t.csv:3: job id 'a' appears twice");
    EXPECT_NE(error_of([&] { csv("id,submit,devices\na,5,1\n"); }).find("no run time"),
              std::string::npos);
    EXPECT_NE(error_of([&] {
                  csv("submit,devices,runtime,flexible\n5,1,10,1\n");
              }).find("'flexible' needs a 'deadline'"),
              std::string::npos);
    EXPECT_NE(error_of([&] {
                  csv("submit,devices,runtime,deadline\n50,1,10,20\n");
              }).find("deadline 20 is before its submit time 50"),
              std::string::npos);
    EXPECT_NE(error_of([&] {
                  csv("submit,devices,runtime,spot\n5,1,10,maybe\n");
              }).find("field 'spot': 'maybe' is not a boolean"),
              std::string::npos);
    EXPECT_NE(error_of([&] {
                  csv("submit,devices,model,steps\n5,8,gpt9,10\n");
              }).find("field 'model': 'gpt9' unknown model preset"),
              std::string::npos);
    EXPECT_EQ(error_of([&] { csv(""); }), "t.csv: no header line and no jobs");
    EXPECT_NE(error_of([&] {
                  parse_trace("{\"submit\": 1, \"devices\": 1, \"runtime\": null}", "j.jsonl",
                              TraceFormat::json);
              }).find("j.jsonl:1: field 'runtime': expected a number"),
              std::string::npos);
    EXPECT_NE(error_of([&] {
                  parse_trace("{\"submit\": 1,", "j.jsonl", TraceFormat::json);
              }).find("j.jsonl:1: not valid JSON"),
              std::string::npos);
    EXPECT_NE(error_of([&] {
                  parse_trace("[1, 2]", "j.json", TraceFormat::json);
              }).find("j.json: job #1: expected a JSON object per job, got number"),
              std::string::npos);
}

TEST(SimSlurm, DurationsTimesAndHostlists) {
    EXPECT_DOUBLE_EQ(parse_slurm_duration("5", "x"), 300);  // minutes, as sbatch -t
    EXPECT_DOUBLE_EQ(parse_slurm_duration("01:30", "x"), 90);
    EXPECT_DOUBLE_EQ(parse_slurm_duration("02:00:05", "x"), 7205);
    EXPECT_DOUBLE_EQ(parse_slurm_duration("1-02", "x"), 86400 + 7200);
    EXPECT_DOUBLE_EQ(parse_slurm_duration("1-02:03:04", "x"), 86400 + 7384);
    EXPECT_EQ(parse_slurm_duration("UNLIMITED", "x"), kNever);
    EXPECT_NE(error_of([] {
                  parse_slurm_duration("1:2:3:4", "f:3: field 'Timelimit'");
              }).find("f:3: field 'Timelimit': '1:2:3:4' is not a Slurm duration"),
              std::string::npos);
    EXPECT_DOUBLE_EQ(
        parse_slurm_time("2026-12-03T05:27:26", "x") - parse_slurm_time("2026-12-02T05:27:20", "x"),
        86406);
    EXPECT_NE(error_of([] { parse_slurm_time("yesterday", "f:2"); }).find("not a Slurm time"),
              std::string::npos);
    EXPECT_EQ(hostlist_count("vm", "x"), 1);
    EXPECT_EQ(hostlist_count("node[01-16]", "x"), 16);
    EXPECT_EQ(hostlist_count("a[1-3,5],b", "x"), 5);
    EXPECT_EQ(hostlist_count("r[1-2]n[1-4]", "x"), 8);
}

TEST(SimSlurm, ConfGivesNodesAndScheduler) {
    const SlurmConf c = parse_slurm_conf(
        "SchedulerType=sched/builtin # FIFO\n"
        "SchedulerParameters=bf_interval=30,bf_max_job_test=250\n"
        "NodeName=DEFAULT Sockets=2 CoresPerSocket=16 ThreadsPerCore=2 Gres=gpu:a100:8\n"
        "NodeName=gpu[001-064] State=UNKNOWN\n"
        "NodeName=gpu[065-096]\n",
        "slurm.conf");
    EXPECT_EQ(c.scheduler, "sched/builtin");
    EXPECT_EQ(c.nodes, 96);
    EXPECT_EQ(c.cpus_per_node, 64);
    EXPECT_EQ(c.gpus_per_node, 8);
    EXPECT_EQ(c.bf_max_job_test, 250);
    EXPECT_NE(error_of([] {
                  parse_slurm_conf("NodeName=a CPUs=4\nNodeName=b CPUs=8\n", "s.conf");
              }).find("s.conf:2: nodes with 8 CPUs"),
              std::string::npos);
    EXPECT_NE(
        error_of([] { parse_slurm_conf("ClusterName=x\n", "s.conf"); }).find("no NodeName lines"),
        std::string::npos);
    EXPECT_NE(error_of([] {
                  parse_slurm_conf("SchedulerType=sched/wiki\nNodeName=a CPUs=1\n", "s.conf");
              }).find("sched/wiki is not one the simulator models"),
              std::string::npos);
}

std::string data(const std::string& name) {
    return std::string(APIARY_SOURCE_DIR) + "/tests/sim/data/" + name;
}

// A real jobcomp/filetxt log: completion order in the file, FIFO order
// (arrival, then job id) in the trace, times from the first submission.
TEST(SimSlurm, JobcompLogOfARealRun) {
    const Trace t = read_trace(data("backfill_jobcomp.txt"));
    ASSERT_EQ(t.jobs.size(), 8u);
    EXPECT_EQ(t.device_unit, "cpus");
    for (size_t i = 0; i < 8; ++i) EXPECT_EQ(t.jobs[i].id, std::to_string(i + 1));
    const JobSpec& j1 = t.jobs[0];
    EXPECT_EQ(j1.devices, 2);
    EXPECT_DOUBLE_EQ(j1.time_limit, 180);
    EXPECT_DOUBLE_EQ(j1.submit, 0);
    EXPECT_DOUBLE_EQ(j1.recorded_start, 1);
    EXPECT_DOUBLE_EQ(j1.runtime, 8);
    EXPECT_EQ(j1.state, "COMPLETED");
    EXPECT_EQ(t.jobs[1].devices, 4);
    EXPECT_NE(error_of([] {
                  parse_jobcomp("Foo=1 JobId=2\n", "j.log", SlurmDevices::cpus);
              }).find("j.log:1: 'Foo=1' is not a jobcomp/filetxt field"),
              std::string::npos);
}

TEST(SimSlurm, SacctSkipsStepsAndTakesEligibleAsArrival) {
    const Trace t = read_trace(data("builtin_sacct.txt"));
    ASSERT_EQ(t.jobs.size(), 8u);
    for (const auto& j : t.jobs) EXPECT_DOUBLE_EQ(j.submit, 0) << j.id;  // all Eligible at :47
    EXPECT_DOUBLE_EQ(t.jobs[0].recorded_start, 2);
    const Trace s = parse_sacct(
        "JobID|Submit|Start|End|Timelimit|AllocTRES|State\n"
        "7|2026-01-01T00:00:00|2026-01-01T00:01:00|2026-01-01T02:01:00|1-00:00:00|"
        "cpu=64,gres/gpu=8,node=1|COMPLETED\n"
        "7.batch|2026-01-01T00:00:00|2026-01-01T00:01:00|2026-01-01T02:01:00||cpu=64|COMPLETED\n"
        "8|2026-01-01T00:00:30|Unknown|Unknown|1:00:00|gres/gpu=4|CANCELLED by 0\n"
        "9|2026-01-01T00:00:40|2026-01-01T00:02:00|Unknown|1:00:00|gres/gpu=16|RUNNING\n",
        "s.txt", SlurmDevices::automatic);
    ASSERT_EQ(s.jobs.size(), 3u);
    EXPECT_EQ(s.device_unit, "gpus");
    EXPECT_EQ(s.jobs[0].devices, 8);
    EXPECT_DOUBLE_EQ(s.jobs[0].runtime, 7200);
    EXPECT_DOUBLE_EQ(s.jobs[0].time_limit, 86400);
    EXPECT_EQ(s.jobs[1].reject, "never started in Slurm (state CANCELLED by 0)");
    EXPECT_EQ(s.jobs[2].reject, "no end in Slurm's record (state RUNNING)");
    EXPECT_EQ(s.notes[0], "1 job-step rows skipped (JobID with '.': batch, extern and srun steps)");
    EXPECT_NE(error_of([] {
                  parse_sacct("JobID|Start|End\n1|x|y\n", "s.txt", SlurmDevices::cpus);
              }).find("sacct header lacks 'Submit'"),
              std::string::npos);
}

// The latency of a recorded scheduler: the mean gap between each wave of
// starts and the latest arrival or end before it.
TEST(SimSlurm, RecordLatency) {
    Trace t;
    t.jobs.resize(3);
    t.jobs[0].submit = 0, t.jobs[0].recorded_start = 2, t.jobs[0].recorded_end = 10;
    t.jobs[1].submit = 0, t.jobs[1].recorded_start = 11, t.jobs[1].recorded_end = 12;
    t.jobs[2].submit = 0, t.jobs[2].recorded_start = 11, t.jobs[2].recorded_end = 14;
    EXPECT_DOUBLE_EQ(record_latency_s(t), (2.0 + 1.0) / 2);
}

TEST(SimProfile, IntegralRepeatsAndMatchesThePlanner) {
    const std::vector<double> hourly = {400, 100, 300};
    const Profile p(3600, hourly);
    EXPECT_DOUBLE_EQ(p.at(3600 * 4 + 5), 100);  // repeats every 3 h
    for (double start : {0.0, 0.5, 2.25, 7.0}) {
        for (double hours : {0.25, 1.0, 5.5, 30.0}) {
            EXPECT_NEAR(p.integral(start * 3600, (start + hours) * 3600) / 3600,
                        plan::profile_gco2(hourly, start, hours, 1.0), 1e-6)
                << start << " " << hours;
        }
    }
    EXPECT_DOUBLE_EQ(p.next_change(3600), 7200);
    EXPECT_EQ(Profile::constant(5).next_change(0), kNever);
}

TEST(SimProfile, BadProfilesNameTheLineAndField) {
    const std::vector<std::string> col = {"gco2_per_kwh"};
    auto table = [&](const std::string& text) { return parse_profile_table(text, "p.csv", col); };
    EXPECT_EQ(table("hour,gco2_per_kwh\n0,400\n1,300\n2,350\n").values[0].size(), 3u);
    EXPECT_EQ(table("400\n300\n# comment\n350\n").values[0].size(), 3u);
    EXPECT_DOUBLE_EQ(table("hour,gco2_per_kwh\n0,1\n0.5,2\n1,3\n").step_s, 1800);
    EXPECT_EQ(error_of([&] { table("hour,gco2_per_kwh\n0,400\n1,300\n3,350\n"); }),
              "p.csv:4: field 'hour': 3 follows 1: rows must come every 1 h without gaps");
    EXPECT_EQ(error_of([&] { table("hour,gco2_per_kwh\n2,400\n"); }),
              "p.csv:2: field 'hour': the profile starts at hour 2; it must start at 0, the "
              "start of the trace");
    EXPECT_EQ(error_of([&] { table("hour,gco2_per_kwh\n0,-4\n"); }),
              "p.csv:2: field 'gco2_per_kwh': '-4' is negative (a value >= 0)");
    EXPECT_EQ(error_of([&] { table("hour,gco2\n0,4\n"); }),
              "p.csv:1: unknown field 'gco2' (known: hour, gco2_per_kwh)");
    EXPECT_EQ(error_of([&] { table("hour,gco2_per_kwh\n0,4\n1\n"); }),
              "p.csv:3: 1 cells but the header has 2 fields");
    EXPECT_EQ(error_of([&] { parse_profile_table("hour\n0\n", "s.csv", {"spot_nodes"}); }),
              "s.csv:1: field 'spot_nodes' is missing from the header");
}

// A job given as a model and a number of steps takes steps x the planner's
// step time, and one that does not fit in memory is rejected with the
// planner's reason.
TEST(SimJobModel, PlannerGivesWorkMemoryAndCheckpoints) {
    const core::Config base = test::config({"cluster.device=H100-SXM", "cluster.gpus=64"});
    JobModel m(base, plan::cluster_from(base, 64), 3600);
    JobSpec j;
    j.where = "t.csv:2";
    j.devices = 64, j.model = "gpt2-350m", j.steps = 1000, j.global_batch = 256, j.seq_len = 1024;
    const JobCost c = m.cost(j);
    ASSERT_EQ(c.reject, "");
    const auto in = plan::plan_input(
        test::config({"cluster.device=H100-SXM", "cluster.gpus=64", "model.preset=gpt2-350m",
                      "plan.global_batch=256", "train.seq_len=1024", "train.batch_size=1"}));
    const plan::Plan p = plan::evaluate(in.w, in.l, in.c);
    EXPECT_DOUBLE_EQ(c.step_s, p.st.total);
    EXPECT_DOUBLE_EQ(c.work_s, 1000 * p.st.total);
    EXPECT_DOUBLE_EQ(c.power_kw, p.tot.power_kw);
    EXPECT_GT(c.ckpt_s, 0);
    EXPECT_GT(c.ckpt_interval_s, c.ckpt_s);
    JobSpec big = j;
    big.model = "gpt3-175b", big.devices = 8;
    EXPECT_NE(m.cost(big).reject.find("does not fit in device memory"), std::string::npos);
    JobSpec odd = j;
    odd.tp = 3;
    EXPECT_NE(m.cost(odd).reject.find("the planner cannot lay it out"), std::string::npos);
}

TEST(SimTrace, ATraceThatIsADeviceIsRefusedUnread) {
    const std::string path =
        (std::filesystem::temp_directory_path() / ("apiary_sim_dev_" + std::to_string(::getpid())))
            .string();
    std::filesystem::remove(path);
    std::filesystem::create_symlink("/dev/null", path);
    try {
        read_trace(path);
        ADD_FAILURE() << "a device was read as a trace";
    } catch (const IoError& e) {
        EXPECT_NE(std::string(e.what()).find("trace: '" + path + "' is not a regular file"),
                  std::string::npos)
            << e.what();
    }
    std::filesystem::remove(path);
}

// docs/sim.md documents every field of the trace format.
TEST(SimDocs, EveryTraceFieldIsDocumented) {
    const std::string doc = read_text_file(std::string(APIARY_SOURCE_DIR) + "/docs/sim.md", "doc");
    for (const auto& f : trace_fields()) {
        EXPECT_NE(doc.find(std::string("`") + f.name + "`"), std::string::npos) << f.name;
    }
}

}  // namespace
}  // namespace apiary::sim
