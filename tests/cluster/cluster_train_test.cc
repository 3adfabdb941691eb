// Training across hosts of the test cluster (cluster.sh): two hosts, each a
// network and UTS namespace of this machine with its own hostname and
// address, joined by shaped links on a bridge. `mpirun` runs on h1 and
// starts h2's daemon through rsh-agent.sh; ranks of one host share memory,
// ranks of two hosts talk TCP over the bridge. Each layout's losses,
// gradient norms and final parameters equal the one-rank run's within the
// layout tests' tolerances (tests/parallel/layouts_test.cc), the ranks ran
// on the hosts the hostfile gave them (each writes its own hostname), and
// the training's traffic crossed h2's link (its byte counters). Needs root;
// skipped otherwise.

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../parallel/layout_util.h"

using namespace apiary::testing;
namespace fs = std::filesystem;

namespace {

const std::string kCluster = CLUSTER_SH;

int64_t read_counter(const std::string& path) {
    std::ifstream in(path);
    int64_t v = -1;
    in >> v;
    return v;
}

class ClusterTraining : public ::testing::Test {
  protected:
    void SetUp() override {
        if (::geteuid() != 0) GTEST_SKIP() << "needs root (network namespaces, veths, a bridge)";
        // Clusters of test processes that died without tearing theirs down.
        reap_stale_clusters();
        id_ = fmt::format("t{:x}", ::getpid() & 0xfffff);
        dir_ = fs::temp_directory_path() /
               ("apiary_cluster_" + id_ + "_" +
                ::testing::UnitTest::GetInstance()->current_test_info()->name());
        fs::remove_all(dir_);
        fs::create_directories(dir_);
        ::setenv("APIARY_CLUSTER_ID", id_.c_str(), 1);
        ::setenv("APIARY_CLUSTER_DIR", (dir_ / "cluster").c_str(), 1);
        up_ = true;
        const auto r = run_command("bash " + kCluster + " up 2");
        ASSERT_EQ(r.exit_code, 0) << r.output;
        runs_ = std::make_unique<LayoutRuns>(dir_);
    }
    void TearDown() override {
        if (up_) {
            const auto r = run_command("bash " + kCluster + " down");
            EXPECT_EQ(r.exit_code, 0) << r.output;
            const auto left = run_command("ip -o link show; ip netns list");
            EXPECT_EQ(left.output.find("apy-" + id_ + "-"), std::string::npos) << "left behind:\n"
                                                                               << left.output;
        }
        if (!dir_.empty()) fs::remove_all(dir_);
    }

    static void reap_stale_clusters() {
        const auto r = run_command("ip netns list");
        std::istringstream in(r.output);
        for (std::string name; in >> name;) {
            unsigned pid = 0;
            char host = 0;
            if (std::sscanf(name.c_str(), "apy-t%x-%c", &pid, &host) != 2 || host != 'h') continue;
            if (fs::exists("/proc/" + std::to_string(pid))) continue;
            run_command(
                fmt::format("APIARY_CLUSTER_ID=t{:x} APIARY_CLUSTER_DIR=/nonexistent "
                            "bash {} down",
                            pid, kCluster));
        }
    }

    // As tests/parallel/layouts_test.cc: 8 blocks of 128 channels, a global
    // batch of 16 sequences of 64 bytes (dp x B x 4 micro-batches), 10 steps.
    static std::string args(int dp, const std::string& extra) {
        return "--set model.preset=tiny --set model.n_layer=8 --set model.n_embd=128 "
               "--set model.n_head=4 --set data.tokenizer=byte --set train.steps=10 "
               "--set train.seq_len=64 --set train.grad_accum=4 --set train.log_every=1 "
               "--set train.eval_every=5 --set train.eval_batches=2 --set train.threads=1 "
               "--set train.warmup_steps=3 --set train.lr=1e-3 "
               "--set train.batch_size=" +
               std::to_string(4 / dp) + " " + extra;
    }

    // `cluster.sh mpirun -n 4` over h1 and h2 (2 slots each); every rank
    // writes the hostname it runs on, then becomes `apiary train`.
    CommandResult run_on_cluster(const std::string& name, const std::string& train_args) {
        const fs::path hosts = dir_ / (name + "_hosts");
        fs::create_directories(hosts);
        const std::string rank_cmd =
            fmt::format("hostname > {}/$OMPI_COMM_WORLD_RANK && exec {} train --set run.dir={} {}",
                        hosts.string(), apiary_bin(), (dir_ / name).string(), train_args);
        return run_command("bash " + kCluster + " mpirun -n 4 sh -c '" + rank_cmd + "'");
    }
    std::vector<std::string> rank_hosts(const std::string& name) const {
        std::vector<std::string> out;
        for (int r = 0; r < 4; ++r) {
            std::ifstream in(dir_ / (name + "_hosts") / std::to_string(r));
            std::string h;
            in >> h;
            out.push_back(h);
        }
        return out;
    }
    // Bytes through h2's link, both ways (the bridge's end of its veth).
    int64_t link_bytes() const {
        const std::string dev = "/sys/class/net/apy-" + id_ + "-v2/statistics/";
        return read_counter(dev + "rx_bytes") + read_counter(dev + "tx_bytes");
    }

    void check_layout(const std::string& name, int dp, const std::string& layout) {
        auto r = runs_->run("base", 1, args(1, ""));
        ASSERT_EQ(r.exit_code, 0) << r.output;
        r = runs_->run("init", 1,
                       args(1,
                            "--set train.steps=1 --set train.lr=0 --set train.min_lr=0 "
                            "--set train.warmup_steps=0"));
        ASSERT_EQ(r.exit_code, 0) << r.output;

        const int64_t before = link_bytes();
        r = run_on_cluster(name, args(dp, layout));
        ASSERT_EQ(r.exit_code, 0) << name << ":\n" << r.output;
        const int64_t crossed = link_bytes() - before;

        // mpirun fills h1's two slots, then h2's.
        EXPECT_EQ(rank_hosts(name), (std::vector<std::string>{"h1", "h1", "h2", "h2"}));
        // A 1.6 M-parameter model: dp moves its gradients over the link
        // every step (~6 MB each way), pp the activations and their
        // gradients (~1 MB a step); ranks that shared one host would move
        // nothing over it (ARP aside).
        EXPECT_GT(crossed, 4 << 20) << "bytes through h2's link";
        std::printf("  %s: %.1f MB through h2's link\n", name.c_str(), crossed / 1e6);

        runs_->expect_series_near("base", name, "loss", 10, 1e-5);
        runs_->expect_series_near("base", name, "grad_norm", 10, 1e-4);
        const double d = runs_->update_difference("base", name, "init", 10);
        EXPECT_LT(d, 1e-4) << name << " vs base";
        std::printf("  %s: parameters differ by %.2e of their movement\n", name.c_str(), d);
    }

    std::string id_;
    fs::path dir_;
    bool up_ = false;
    std::unique_ptr<LayoutRuns> runs_;
};

TEST_F(ClusterTraining, DataParallelOverTwoHostsMatchesOneRank) {
    check_layout("dp4", 4, "--set parallel.dp=4");
}

TEST_F(ClusterTraining, TensorInsideHostsPipelineAcrossMatchesOneRank) {
    // The mesh's default axis order (tp fastest) puts each tensor-parallel
    // pair on one host; the two pipeline stages are the two hosts.
    check_layout("tp2_pp2", 1, "--set parallel.tp=2 --set parallel.pp=2");
}

// Link faults that TCP rides out: the run must end exactly as the clean run
// on the same layout does (the same reductions in the same order, so the
// same losses bit for bit), only later.
std::string fault_args(const std::string& extra) {
    return "--set parallel.dp=4 --set train.steps=12 --set train.eval_every=100000 " + extra;
}

int steps_logged(const fs::path& run_dir) {
    int n = 0;
    for (const auto& line : read_lines((run_dir / "metrics.jsonl").string())) {
        n += line.find("\"loss\"") != std::string::npos;
    }
    return n;
}

TEST_F(ClusterTraining, ShortLinkFlapUnderTheTimeoutLeavesTheRunAsIfNothingHappened) {
    const std::string train = args(4, fault_args("--set comm.timeout_s=60"));
    auto r = run_on_cluster("clean", train);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const fs::path run_dir = dir_ / "flap";
    Background job(fmt::format("bash {} mpirun -n 4 {} train --set run.dir={} {}", kCluster,
                               apiary_bin(), run_dir.string(), train),
                   (dir_ / "flap.out").string());
    ASSERT_TRUE(wait_until([&] { return steps_logged(run_dir) >= 3; }, 300)) << job.output();
    // h2's link down for 5 s, well under comm.timeout_s: TCP retransmits.
    r = run_command("bash " + kCluster + " link h2 down");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const int at_down = steps_logged(run_dir);
    ::sleep(5);
    // Nothing crosses a link that is down: the run stood still.
    EXPECT_LE(steps_logged(run_dir) - at_down, 1);
    r = run_command("bash " + kCluster + " link h2 up");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(job.wait(), 0) << job.output();
    EXPECT_EQ(job.output().find("did not answer"), std::string::npos) << job.output();
    runs_->expect_series_near("clean", "flap", "loss", 12, 0.0);
    runs_->expect_series_near("clean", "flap", "grad_norm", 12, 0.0);
}

TEST_F(ClusterTraining, PacketLossAndLatencyOnOneHostChangeNothingButTheTime) {
    const std::string train = args(4, fault_args("--set comm.timeout_s=120"));
    const auto timed = [&](const std::string& name) {
        const auto t0 = std::chrono::steady_clock::now();
        const auto r = run_on_cluster(name, train);
        EXPECT_EQ(r.exit_code, 0) << name << ":\n" << r.output;
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    };
    const double clean_s = timed("clean");
    auto r = run_command("bash " + kCluster + " link h2 loss 2%");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    // 5 ms more each way where the kernel has netem (cluster.sh refuses
    // delays otherwise, saying so).
    r = run_command("bash " + kCluster + " link h2 delay 5ms");
    const bool delayed = r.exit_code == 0;
    if (!delayed) std::printf("  no netem here, loss only: %s\n", r.output.c_str());
    const double lossy_s = timed("lossy");
    runs_->expect_series_near("clean", "lossy", "loss", 12, 0.0);
    runs_->expect_series_near("clean", "lossy", "grad_norm", 12, 0.0);
    std::printf("  12 steps: clean %.1f s, 2%% loss%s on h2 %.1f s (%.2fx)\n", clean_s,
                delayed ? " + 5 ms" : "", lossy_s, lossy_s / clean_s);
}

// The apiary processes running in host h<i> (by the network namespace).
std::vector<int> apiary_pids_on(const std::string& id, int host) {
    const auto r = run_command(fmt::format("ip netns pids apy-{}-h{}", id, host));
    std::istringstream in(r.output);
    std::vector<int> out;
    for (int pid; in >> pid;) {
        std::ifstream comm("/proc/" + std::to_string(pid) + "/comm");
        std::string name;
        comm >> name;
        if (name == "apiary") out.push_back(pid);
    }
    return out;
}

// dp 4 over h1 (ranks 0, 1) and h2 (ranks 2, 3), run in the background;
// once it has trained 3 steps, h2 crashes (its link down, then every process
// in it SIGKILLed, so that nothing it had open says goodbye).
std::unique_ptr<Background> start_and_crash_h2(const fs::path& dir, const std::string& id,
                                               const std::string& mpirun_args,
                                               const std::string& train_args) {
    const fs::path run_dir = dir / "crash";
    auto job = std::make_unique<Background>(
        fmt::format("bash {} mpirun {} -n 4 {} train --set run.dir={} {}", kCluster, mpirun_args,
                    apiary_bin(), run_dir.string(), train_args),
        (dir / "crash.out").string());
    const auto steps_done = [&] {
        int n = 0;
        for (const auto& line : read_lines((run_dir / "metrics.jsonl").string())) {
            n += line.find("\"loss\"") != std::string::npos;
        }
        return n;
    };
    EXPECT_TRUE(wait_until([&] { return steps_done() >= 3; }, 300)) << job->output();
    EXPECT_EQ(apiary_pids_on(id, 1).size(), 2u);
    EXPECT_EQ(apiary_pids_on(id, 2).size(), 2u);
    const auto r = run_command("bash " + kCluster + " crash h2");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_TRUE(apiary_pids_on(id, 2).empty());
    return job;
}

std::string crash_args(int timeout_s) {
    return "--set parallel.dp=4 --set train.steps=100000 --set train.eval_every=100000 "
           "--set comm.timeout_s=" +
           std::to_string(timeout_s);
}

TEST_F(ClusterTraining, HostCrashStopsTheOtherRanksNamingTheMissingOnes) {
    // The ranks on h1 wait in the gradients' all-reduce until comm.timeout_s,
    // then the watchdog names the ranks that did not answer and ends them.
    auto job = start_and_crash_h2(dir_, id_, "", args(4, crash_args(15)));
    ASSERT_FALSE(HasFailure());
    // Bounds to give up by, far past timeout_s and the watchdog's exchange.
    const std::string diagnosis = "ranks 2,3 did not answer";
    EXPECT_TRUE(wait_until([&] { return job->output().find(diagnosis) != std::string::npos; }, 300))
        << job->output();
    EXPECT_NE(job->output().find("exceeded comm.timeout_s = 15 s"), std::string::npos)
        << job->output();
    EXPECT_TRUE(wait_until([&] { return apiary_pids_on(id_, 1).empty(); }, 120))
        << "the ranks on h1 are still running";
    // mpirun itself waits on h2's daemon (see docs/distributed.md, "Many
    // hosts"); tearing the cluster down ends it.
    run_command("bash " + kCluster + " down");
    job->wait();
    std::printf("  after the crash:\n%s\n",
                job->output().substr(job->output().rfind("\r") + 1).c_str());
}

TEST_F(ClusterTraining, HostCrashWithKeepalivesEndsTheJobNamingTheHost) {
    // With TCP keepalives on mpirun's connections to its daemons (the
    // settings docs/distributed.md gives), mpirun notices the lost host by
    // itself, well before comm.timeout_s, and ends the job naming it.
    auto job = start_and_crash_h2(dir_, id_,
                                  "--mca oob_tcp_keepalive_time 5 --mca oob_tcp_keepalive_intvl 2 "
                                  "--mca oob_tcp_keepalive_probes 3",
                                  args(4, crash_args(600)));
    ASSERT_FALSE(HasFailure());
    // A bound to give up by, far past the keepalives' 11 s.
    const auto ended = [&] {
        siginfo_t info{};
        return ::waitid(P_PID, id_t(job->pid()), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
               info.si_pid != 0;
    };
    ASSERT_TRUE(wait_until(ended, 300)) << "mpirun did not end:\n" << job->output();
    EXPECT_NE(job->wait(), 0);
    const std::string out = job->output();
    EXPECT_NE(out.find("ORTE has lost communication with a remote daemon"), std::string::npos)
        << out;
    EXPECT_NE(out.find("on node h2"), std::string::npos) << out;
    EXPECT_TRUE(wait_until([&] { return apiary_pids_on(id_, 1).empty(); }, 60))
        << "the ranks on h1 are still running";
    EXPECT_EQ(out.find("did not answer"), std::string::npos) << "the watchdog fired first:\n"
                                                             << out;
}

}  // namespace

namespace {

// The value and host label of a rank's apiary_straggler_ratio, from its
// /metrics page (read inside its host: the endpoint binds that host's
// loopback).
struct StragglerSample {
    std::string host;
    double ratio = -1;
};
StragglerSample straggler_of(int rank) {
    const auto r = run_command(
        fmt::format("bash {} exec h{} curl -s --max-time 10 http://127.0.0.1:{}/metrics", kCluster,
                    rank < 2 ? 1 : 2, 9400 + rank));
    StragglerSample s;
    std::istringstream in(r.output);
    for (std::string line; std::getline(in, line);) {
        if (line.rfind("apiary_straggler_ratio{", 0) != 0) continue;
        const size_t h = line.find("host=\"");
        if (h != std::string::npos) s.host = line.substr(h + 6, line.find('"', h + 6) - h - 6);
        s.ratio = std::stod(line.substr(line.rfind(' ') + 1));
    }
    return s;
}

}  // namespace

TEST_F(ClusterTraining, StragglerHostIsNamedByTheGaugeAndTheTraceSummary) {
    // h2's CPU time capped at 20% of one core for everything in it (a cgroup
    // of the test's own; cluster.sh falls back to a SIGSTOP/SIGCONT duty
    // cycle where no cpu controller is writable, and says so).
    auto r = run_command("bash " + kCluster + " cpu h2 20%");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    std::printf("  %s", r.output.c_str());
    const fs::path run_dir = dir_ / "straggler";
    Background job(fmt::format("bash {} mpirun -n 4 {} train --set run.dir={} {}", kCluster,
                               apiary_bin(), run_dir.string(),
                               args(4, fault_args("--set comm.timeout_s=300 "
                                                  "--set profile.steps=8-11"))),
                   (dir_ / "straggler.out").string());
    ASSERT_TRUE(wait_until([&] { return steps_logged(run_dir) >= 5; }, 600)) << job.output();
    // Every rank's gauge, read while the run goes on: the largest ratio is
    // a rank of h2, and its series says so.
    std::vector<StragglerSample> g;
    for (int rank = 0; rank < 4; ++rank) g.push_back(straggler_of(rank));
    EXPECT_EQ(job.wait(), 0) << job.output();
    int worst = 0;
    for (int rank = 0; rank < 4; ++rank) {
        std::printf("  rank %d: apiary_straggler_ratio{host=\"%s\"} %.2f\n", rank,
                    g[size_t(rank)].host.c_str(), g[size_t(rank)].ratio);
        EXPECT_EQ(g[size_t(rank)].host, rank < 2 ? "h1" : "h2") << "rank " << rank;
        if (g[size_t(rank)].ratio > g[size_t(worst)].ratio) worst = rank;
    }
    EXPECT_EQ(g[size_t(worst)].host, "h2");
    EXPECT_GE(worst, 2);
    // The trace of steps 8-11 names the same host.
    r = run_command(apiary_bin() + " trace summary --json " + run_dir.string());
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto doc = nlohmann::json::parse(r.output);
    EXPECT_EQ(doc["straggler"]["host"], "h2") << r.output;
    EXPECT_GE(doc["straggler"]["rank"].get<int>(), 2) << r.output;
    EXPECT_EQ(doc["straggler"]["fastest_host"], "h1") << r.output;
    r = run_command(apiary_bin() + " trace summary " + run_dir.string());
    const size_t at = r.output.find("slowest rank:");
    ASSERT_NE(at, std::string::npos) << r.output;
    std::printf("  %s", r.output.substr(at, r.output.find('\n', at) + 1 - at).c_str());
    double step_s = 0;
    int n = 0;
    for (const auto& line : read_lines((run_dir / "metrics.jsonl").string())) {
        const auto j = nlohmann::json::parse(line);
        if (j.contains("step_time_s") && j.value("step", 0) > 2) {
            step_s += j["step_time_s"].get<double>();
            ++n;
        }
    }
    if (n) std::printf("  mean step %.3f s (steps 3-12)\n", step_s / n);
}

namespace {

// The step numbers metrics.jsonl records, in order.
std::vector<int> logged_steps(const fs::path& run_dir) {
    std::vector<int> out;
    for (const auto& line : read_lines((run_dir / "metrics.jsonl").string())) {
        if (line.find("\"loss\"") == std::string::npos) continue;
        out.push_back(nlohmann::json::parse(line).value("step", -1));
    }
    return out;
}

bool has_file(const fs::path& p) {
    std::error_code ec;
    return fs::exists(p, ec);
}

}  // namespace

TEST_F(ClusterTraining, PartitionDuringASaveLeavesNoTornCheckpointAndTheRunResumes) {
    // `apiary launch --hosts` on h1, as docs/distributed.md gives it, with
    // this cluster's launcher flags; the launch restarts a failed job up to
    // twice, from the newest complete checkpoint.
    const int timeout_s = 10, steps = 24, every = 4;
    const fs::path run_dir = dir_ / "partition";
    std::string launcher_args;
    for (const std::string& a : std::vector<std::string>{
             "--mca", "plm_rsh_agent", std::string(CLUSTER_DIR) + "/rsh-agent.sh", "--mca", "btl",
             "tcp,self,vader", "--mca", "btl_tcp_if_include", "10.213.0.0/24", "--mca",
             "oob_tcp_if_include", "10.213.0.0/24", "--oversubscribe", "--bind-to", "none"}) {
        launcher_args += " --launcher-arg=" + a;
    }
    const std::string train = args(
        4, fmt::format("--set parallel.dp=4 --set train.steps={} --set train.eval_every=100000 "
                       "--set train.ckpt_every={} --set train.ckpt_async=true "
                       "--set comm.timeout_s={}",
                       steps, every, timeout_s));
    Background job(fmt::format("bash {} exec h1 {} launch -n 4 --hosts h1:2,h2:2 --max-restarts 2 "
                               "--min-ranks 2{} -- train --set run.dir={} {}",
                               kCluster, apiary_bin(), launcher_args, run_dir.string(), train),
                   (dir_ / "partition.out").string());
    const std::string restart = "restart 1 of 2";
    // h2's link goes down as a save of step 8 or later starts (its step
    // folder appears). The saves are asynchronous (train.ckpt_async): the
    // ranks write their parts beside the next step and commit once all
    // are done, so a save is in flight for about a step. One that still
    // commits (its ranks had agreed before the link went) makes this a
    // short flap: the link comes back and the next save is tried, up to
    // three.
    fs::path torn;
    for (int tries = 0; tries < 3 && torn.empty(); ++tries) {
        const int step = 8 + every * tries;
        const fs::path dir = run_dir / "ckpt" / fmt::format("step_{:08d}", step);
        const auto writing = [&] {
            std::error_code ec;
            return fs::is_directory(dir, ec);
        };
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(600);
        while (!writing() && std::chrono::steady_clock::now() < until && !job.exited_within(0)) {
            std::this_thread::sleep_for(std::chrono::milliseconds(2));
        }
        ASSERT_TRUE(writing()) << "no save of step " << step << ":\n" << job.output();
        // The bridge's end of h2's veth down at once, then the same through
        // the script (which records it: its rsh agent reads it).
        auto r = run_command(fmt::format("ip link set dev apy-{}-v2 down", id_));
        ASSERT_EQ(r.exit_code, 0) << r.output;
        r = run_command("bash " + kCluster + " link h2 down");
        ASSERT_EQ(r.exit_code, 0) << r.output;
        // The manifest is written right after the ranks agree: seconds
        // later it is there or the save is cut.
        ::sleep(3);
        if (!has_file(dir / "manifest.json")) {
            torn = dir;
            break;
        }
        std::printf("  the save of step %d committed before the link went down; next save\n", step);
        r = run_command("bash " + kCluster + " link h2 up");
        ASSERT_EQ(r.exit_code, 0) << r.output;
    }
    ASSERT_FALSE(torn.empty()) << "no save was cut by the partition";
    const int torn_step = std::stoi(torn.filename().string().substr(5));
    const auto t_down = std::chrono::steady_clock::now();
    // The link stays down past comm.timeout_s until the job has ended and
    // the launch restarts it (a bound to give up by, far past the timeout).
    ASSERT_TRUE(wait_until([&] { return job.output().find(restart) != std::string::npos; }, 600))
        << job.output();
    const double down_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t_down).count() + 3;
    // The cut save: shards of some ranks, no manifest, and never picked.
    EXPECT_FALSE(has_file(torn / "manifest.json"));
    auto r = run_command(apiary_bin() + " ckpt verify " + torn.string());
    EXPECT_NE(r.exit_code, 0) << r.output;
    std::printf("  torn save step %d: ckpt verify says: %s", torn_step,
                r.output.substr(r.output.rfind("error")).c_str());
    const std::string from = fmt::format("from checkpoint step_{:08d}", torn_step - every);
    EXPECT_NE(job.output().find(from), std::string::npos) << job.output();
    r = run_command("bash " + kCluster + " link h2 up");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(job.wait(), 0) << job.output();
    const std::string out = job.output();
    // The first attempt ended naming the silent side: the watchdog names
    // ranks, mpirun's keepalives the host (whichever came first).
    const bool named = out.find("did not answer") != std::string::npos ||
                       out.find("on node h2") != std::string::npos;
    EXPECT_TRUE(named) << out;
    for (const std::string what : {"did not answer", "ORTE has lost communication", "on node h2"}) {
        const size_t at = out.find(what);
        if (at == std::string::npos) continue;
        const size_t b = out.rfind('\n', at) + 1;
        std::printf("  %s\n", out.substr(b, out.find('\n', at) - b).c_str());
    }
    EXPECT_EQ(out.find("restart 2 of 2"), std::string::npos) << out;
    // Every step once, in order, to the last: the resumed run redid the
    // steps after the last complete checkpoint and lost none before it.
    std::vector<int> want(steps);
    for (int s = 0; s < steps; ++s) want[size_t(s)] = s + 1;
    EXPECT_EQ(logged_steps(run_dir), want);
    r = run_command(apiary_bin() + " ckpt verify " + run_dir.string());
    EXPECT_EQ(r.exit_code, 0) << r.output;
    r = run_command(apiary_bin() + " ckpt verify " +
                    (run_dir / "ckpt" / fmt::format("step_{:08d}", torn_step - every)).string());
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_TRUE(has_file(torn / "manifest.json")) << "the resumed run saved step " << torn_step;
    const size_t at = out.find("apiary launch: the job exited");
    std::printf("  link down %.0f s (comm.timeout_s = %d); %s\n", down_s, timeout_s,
                out.substr(at, out.find('\n', at) - at).c_str());
}
