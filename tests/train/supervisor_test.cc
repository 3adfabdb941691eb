// `apiary launch`'s supervision without the binary (train/supervisor.h): the
// launcher's command line for given ranks, threads, hosts and machine, the
// restart policy, and the restart loop with a stand-in for mpirun.
#include "train/supervisor.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "../obs/obs_test_util.h"
#include "core/error.h"
#include "train/keys.h"

namespace apiary::train {
namespace {

namespace fs = std::filesystem;
using Args = std::vector<std::string>;

// A machine with 8 cores, not root, outside Slurm.
LaunchHost host8() {
    LaunchHost h;
    h.cores = 8;
    h.self = "/opt/apiary";
    return h;
}

LaunchOptions options(int ranks, int threads, Args args) {
    LaunchOptions o;
    o.ranks = ranks;
    o.threads = threads;
    o.args = std::move(args);
    return o;
}

core::Schema train_schema() {
    core::Schema s;
    core::add_shared_keys(s);
    train::add_keys(s);
    return s;
}

core::Config load(const std::string& file, const Args& sets) {
    static const core::Schema schema = train_schema();
    core::Config c(schema);
    if (!file.empty()) c.load_file(file);
    for (const auto& s : sets) c.set(s);
    return c;
}

TEST(LaunchCommand, RanksWithinTheCoresRunPlainMpirun) {
    EXPECT_EQ(
        launch_command(options(4, 1, {"config", "show"}), host8()),
        (Args{"mpirun", "-n", "4", "-x", "OMP_NUM_THREADS=1", "/opt/apiary", "config", "show"}));
}

TEST(LaunchCommand, ThreadsPerRankAreMappedAndBound) {
    EXPECT_EQ(launch_command(options(2, 3, {"train"}), host8()),
              (Args{"mpirun", "-n", "2", "-x", "OMP_NUM_THREADS=3", "--map-by", "slot:PE=3",
                    "--bind-to", "core", "/opt/apiary", "train"}));
}

TEST(LaunchCommand, AllTheCoresYieldAndMoreOversubscribeUnbound) {
    EXPECT_EQ(launch_command(options(4, 2, {"train"}), host8()),
              (Args{"mpirun", "-n", "4", "-x", "OMP_NUM_THREADS=2", "--mca", "mpi_yield_when_idle",
                    "1", "--map-by", "slot:PE=2", "--bind-to", "core", "/opt/apiary", "train"}));
    EXPECT_EQ(launch_command(options(9, 1, {"train"}), host8()),
              (Args{"mpirun", "-n", "9", "-x", "OMP_NUM_THREADS=1", "--mca", "mpi_yield_when_idle",
                    "1", "--oversubscribe", "--bind-to", "none", "/opt/apiary", "train"}));
}

TEST(LaunchCommand, HostsRootAndLauncherArgsReachMpirun) {
    LaunchOptions o = options(16, 1, {"train"});
    o.hosts = "node1:8,node2:8";
    o.extra = {"--tag-output"};
    LaunchHost h = host8();
    h.root = true;
    // With hosts the ranks are not all here: no oversubscription.
    // clang-format off
    EXPECT_EQ(launch_command(o, h),
              (Args{"mpirun", "-n", "16", "-x", "OMP_NUM_THREADS=1", "--allow-run-as-root",
                    "--mca", "mpi_yield_when_idle", "1", "--host", "node1:8,node2:8",
                    "--mca", "oob_tcp_keepalive_time", "5", "--mca", "oob_tcp_keepalive_intvl", "2",
                    "--mca", "oob_tcp_keepalive_probes", "3", "--mca", "btl_tcp_links", "2",
                    "--tag-output", "/opt/apiary", "train"}));
    // clang-format on
}

TEST(LaunchCommand, SrunInsideSlurmOrWhenAsked) {
    const Args srun{"env",
                    "OMP_NUM_THREADS=2",
                    "srun",
                    "-n",
                    "2",
                    "--cpus-per-task=2",
                    "--kill-on-bad-exit=1",
                    "/opt/apiary",
                    "train"};
    LaunchHost h = host8();
    h.slurm = true;
    EXPECT_EQ(launch_command(options(2, 2, {"train"}), h), srun);
    LaunchOptions o = options(2, 2, {"train"});
    o.launcher = "srun";
    EXPECT_EQ(launch_command(o, host8()), srun);
    o.launcher = "mpirun";
    EXPECT_EQ(launch_command(o, h)[0], "mpirun");
}

TEST(LaunchCommand, ASupervisedTrainRunResumesAutomatically) {
    LaunchOptions o = options(2, 1, {"train", "--config", "x.toml"});
    o.max_restarts = 2;
    const Args tail{"/opt/apiary", "train", "--auto-resume", "--config", "x.toml"};
    Args cmd = launch_command(o, host8());
    EXPECT_EQ(Args(cmd.end() - 5, cmd.end()), tail);
    // Not twice, not with --resume, not for other verbs, not unsupervised.
    o.args = {"train", "--auto-resume"};
    cmd = launch_command(o, host8());
    EXPECT_EQ(std::count(cmd.begin(), cmd.end(), "--auto-resume"), 1);
    o.args = {"train", "--resume", "runs/x"};
    cmd = launch_command(o, host8());
    EXPECT_EQ(std::count(cmd.begin(), cmd.end(), "--auto-resume"), 0);
    o.args = {"config", "show"};
    cmd = launch_command(o, host8());
    EXPECT_EQ(std::count(cmd.begin(), cmd.end(), "--auto-resume"), 0);
    o = options(2, 1, {"train"});
    cmd = launch_command(o, host8());
    EXPECT_EQ(std::count(cmd.begin(), cmd.end(), "--auto-resume"), 0);
}

TEST(LaunchCommand, NothingToRunOrLaunchItselfIsRefused) {
    try {
        launch_command(options(2, 1, {}), host8());
        FAIL() << "an empty command was accepted";
    } catch (const ConfigError& e) {
        EXPECT_NE(std::string(e.what()).find("launch: nothing to run; give the apiary verb"),
                  std::string::npos)
            << e.what();
    }
    try {
        launch_command(options(2, 1, {"launch", "-n", "2"}), host8());
        FAIL() << "launch was launched";
    } catch (const ConfigError& e) {
        EXPECT_NE(std::string(e.what()).find("cannot launch `launch` itself"), std::string::npos)
            << e.what();
    }
}

TEST(LaunchCommand, TheShellLineQuotesWhatAShellWouldSplit) {
    EXPECT_EQ(shell_line({"mpirun", "-n", "2", "a b", "it's", "", "x=$HOME"}),
              "mpirun -n 2 'a b' 'it'\\''s' '' 'x=$HOME'");
}

TEST(LaunchRestartPolicy, FailuresRestartCompletionStopAndHealthDoNot) {
    EXPECT_FALSE(restarts_after(0));    // completed
    EXPECT_FALSE(restarts_after(130));  // a stop signal, checkpoint saved
    EXPECT_FALSE(restarts_after(75));   // stopped for its health
    EXPECT_TRUE(restarts_after(1));
    EXPECT_TRUE(restarts_after(127));  // the launcher is missing
    EXPECT_TRUE(restarts_after(137));  // a rank was killed
}

TEST(LaunchRestartPolicy, MinRanksHalvesOnlyARepeatedFailureWithoutProgress) {
    EXPECT_EQ(ranks_for_restart(8, 2, 1, false), 8);  // the first restart is on all ranks
    EXPECT_EQ(ranks_for_restart(8, 2, 2, false), 4);
    EXPECT_EQ(ranks_for_restart(8, 2, 2, true), 8);   // a new checkpoint: no rank is lost
    EXPECT_EQ(ranks_for_restart(8, 0, 2, false), 8);  // no --min-ranks
    EXPECT_EQ(ranks_for_restart(4, 2, 3, false), 2);
    EXPECT_EQ(ranks_for_restart(2, 2, 3, false), 2);  // not below the minimum
    EXPECT_EQ(ranks_for_restart(5, 3, 3, false), 5);  // 5 / 2 = 2 < 3
}

class LaunchSupervise : public ::testing::Test {
  protected:
    LaunchOptions train_options(int ranks, int max_restarts, int min_ranks) const {
        LaunchOptions o = options(ranks, 1,
                                  {"train", "--set", "run.dir=" + (dir_ / "run").string(), "--set",
                                   "metrics.enabled=false"});
        o.max_restarts = max_restarts;
        o.min_ranks = min_ranks;
        return o;
    }
    // The stand-in for mpirun: records each attempt, returns the next exit
    // code, and saves a checkpoint named ckpt_<attempt> when asked to.
    LaunchHooks hooks(std::vector<int> codes, std::vector<bool> saves = {}) {
        LaunchHooks h;
        h.on_restart = [this](const RestartNotice& n) { notices_.push_back(n); };
        h.run = [this, codes, saves](const Args& cmd, int restart) {
            const size_t i = attempts_.size();
            attempts_.push_back({cmd, restart});
            if (i < saves.size() && saves[i]) {
                fs::create_directories(dir_ / "run" / "ckpt");
                std::ofstream(dir_ / "run" / "ckpt" / "latest") << "ckpt_" << i << "\n";
            }
            return codes.at(i);
        };
        return h;
    }
    int ranks_of(size_t attempt) const { return std::stoi(attempts_.at(attempt).first.at(2)); }

    const testing::TempDir tmp_;
    const fs::path dir_{tmp_.path()};
    std::vector<std::pair<Args, int>> attempts_;
    std::vector<RestartNotice> notices_;
};

TEST_F(LaunchSupervise, AFailedJobRestartsUntilItCompletes) {
    EXPECT_EQ(supervise(train_options(2, 3, 0), host8(), load, hooks({137, 1, 0})), 0);
    ASSERT_EQ(attempts_.size(), 3u);
    EXPECT_EQ(attempts_[0].second, 0);
    EXPECT_EQ(attempts_[2].second, 2);  // APIARY_RESTART for the trainer's restart event
    EXPECT_NE(std::find(attempts_[1].first.begin(), attempts_[1].first.end(), "--auto-resume"),
              attempts_[1].first.end());
    ASSERT_EQ(notices_.size(), 2u);
    EXPECT_EQ(notices_[0].exit_code, 137);
    EXPECT_EQ(notices_[1].exit_code, 1);
    EXPECT_EQ(notices_[1].restart, 2);
    EXPECT_EQ(notices_[1].max_restarts, 3);
    EXPECT_EQ(notices_[1].checkpoint, "");
}

TEST_F(LaunchSupervise, TheLimitEndsItWithTheLastExitCode) {
    EXPECT_EQ(supervise(train_options(2, 2, 0), host8(), load, hooks({1, 1, 9, 0})), 9);
    EXPECT_EQ(attempts_.size(), 3u);
}

TEST_F(LaunchSupervise, AStopOrAHealthStopIsNotRestarted) {
    EXPECT_EQ(supervise(train_options(2, 3, 0), host8(), load, hooks({130})), 130);
    EXPECT_EQ(attempts_.size(), 1u);
    attempts_.clear();
    EXPECT_EQ(supervise(train_options(2, 3, 0), host8(), load, hooks({75})), 75);
    EXPECT_EQ(attempts_.size(), 1u);
    attempts_.clear();
    EXPECT_EQ(supervise(train_options(2, 0, 0), host8(), load, hooks({1})), 1);
    EXPECT_EQ(attempts_.size(), 1u);  // unsupervised
}

TEST_F(LaunchSupervise, MinRanksHalvesWhenARestartMakesNoProgress) {
    EXPECT_EQ(supervise(train_options(8, 4, 2), host8(), load, hooks({1, 1, 1, 1, 0})), 0);
    std::vector<int> ranks;
    for (size_t i = 0; i < attempts_.size(); ++i) ranks.push_back(ranks_of(i));
    EXPECT_EQ(ranks, (std::vector<int>{8, 8, 4, 2, 2}));
}

TEST_F(LaunchSupervise, ANewCheckpointKeepsTheRanksAndIsNamed) {
    EXPECT_EQ(
        supervise(train_options(8, 3, 2), host8(), load, hooks({1, 1, 1, 0}, {true, true, false})),
        0);
    std::vector<int> ranks;
    for (size_t i = 0; i < attempts_.size(); ++i) ranks.push_back(ranks_of(i));
    // Restart 2 follows a run that saved ckpt_1; restart 3 one that saved nothing.
    EXPECT_EQ(ranks, (std::vector<int>{8, 8, 8, 4}));
    ASSERT_EQ(notices_.size(), 3u);
    EXPECT_EQ(notices_[0].checkpoint, "ckpt_0");
    EXPECT_EQ(notices_[2].checkpoint, "ckpt_1");
}

TEST_F(LaunchSupervise, ScrapeTargetsAreWrittenBeforeEachRun) {
    LaunchOptions o = train_options(3, 1, 0);
    o.args.back() = "metrics.enabled=true";
    o.hosts = "n1:2,n2";
    LaunchHooks h = hooks({1, 0});
    std::vector<std::string> written;
    h.on_targets = [&](const std::string& f) { written.push_back(f); };
    EXPECT_EQ(supervise(o, host8(), load, h), 0);
    const std::string sd = (dir_ / "prometheus" / "run.json").string();
    EXPECT_EQ(written, (Args{sd, sd}));
    const std::string text = testing::read_file(sd);
    EXPECT_NE(text.find("\"n2:9402\""), std::string::npos) << text;
}

TEST_F(LaunchSupervise, BadHostSlotsAreRefusedNamingTheValue) {
    LaunchOptions o = train_options(2, 0, 0);
    o.args.back() = "metrics.enabled=true";
    o.hosts = "n1:four";
    try {
        supervise(o, host8(), load, hooks({0}));
        FAIL() << "--hosts n1:four was accepted";
    } catch (const ConfigError& e) {
        EXPECT_NE(std::string(e.what()).find("'n1:four' is not host:slots"), std::string::npos)
            << e.what();
    }
    EXPECT_TRUE(attempts_.empty());  // refused before any rank started
}

TEST(LaunchRunDir, TheTrainCommandsRunDirectory) {
    EXPECT_EQ(run_dir_of({"train", "--set", "run.dir=runs/a"}, load), "runs/a");
    EXPECT_EQ(run_dir_of({"train", "--auto-resume", "--resume", "runs/b"}, load), "runs/b");
    EXPECT_EQ(run_dir_of({"config", "show"}, load), "");
    // A config that does not load: the ranks report it.
    EXPECT_EQ(run_dir_of({"train", "--set", "no.such_key=1"}, load), "");
}

}  // namespace
}  // namespace apiary::train
