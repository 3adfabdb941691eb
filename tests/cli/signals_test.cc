// A stop signal at any moment of `apiary train` once it runs (starting up,
// training, evaluating, saving) finishes the step, saves a checkpoint that loads, and
// exits 130: never an abort or a lost checkpoint. The signals arrive on a
// thread of their own (core/signals.h); before that, one landing on a thread
// inside oneDNN's JIT sgemm corrupted the heap.

#include <gtest/gtest.h>

#include <filesystem>
#include <random>

#include "../cli_util.h"

using namespace apiary::testing;
namespace fs = std::filesystem;

TEST(Signals, TwentySignalsAtRandomMomentsEachSaveAGoodCheckpointAndExit130) {
    const fs::path dir =
        fs::temp_directory_path() / ("apiary_signals_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
    const uint32_t seed = std::random_device{}();
    std::mt19937 rng(seed);
    std::uniform_real_distribution<double> delay(0.0, 2.5);
    const int signals[] = {SIGINT, SIGTERM, SIGUSR1};
    for (int i = 0; i < 20; ++i) {
        const std::string precision = i % 2 ? "bf16" : "fp32";
        const int sig = signals[i % 3];
        const double wait_s = delay(rng);
        SCOPED_TRACE(::testing::Message() << "run " << i << " (seed " << seed << "): " << precision
                                          << ", " << strsignal(sig) << " after " << wait_s << " s");
        const fs::path run = dir / ("run" + std::to_string(i));
        Background bg(apiary_bin() + " train --set run.dir=" + run.string() +
                          " --set data.tokenizer=byte --set model.n_layer=2"
                          " --set train.batch_size=4 --set train.seq_len=64"
                          " --set train.steps=100000000 --set train.eval_every=7"
                          " --set train.ckpt_every=5 --set train.eval_batches=2"
                          " --set train.precision=" +
                          precision,
                      (dir / "out.txt").string());
        // The moments start once the program runs: before that only the
        // dynamic loader does (a few milliseconds), and a signal then ends the
        // process by its default action, with nothing yet to save.
        const pid_t pid = bg.pid();
        ASSERT_TRUE(wait_until([&] { return blocks_stop_signals(pid); }, 60)) << bg.output();
        std::this_thread::sleep_for(std::chrono::duration<double>(wait_s));
        bg.signal(sig);
        ASSERT_EQ(bg.wait(), 130) << bg.output();
        ASSERT_NE(bg.output().find("interrupted after step"), std::string::npos) << bg.output();
        // The checkpoint `latest` names passes every check on load.
        const auto r =
            run_command(apiary_bin() + " generate --run " + run.string() + " --tokens 1");
        ASSERT_EQ(r.exit_code, 0) << r.output;
        fs::remove_all(run);
    }
    fs::remove_all(dir);
}

TEST(Signals, LaunchTurnsAStopIntoACheckpointOnEveryRank) {
    // mpirun ends its ranks on SIGINT or SIGTERM; `apiary launch` forwards
    // SIGUSR1 instead, so both ranks finish the same step and save.
    const fs::path dir =
        fs::temp_directory_path() / ("apiary_launch_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
    for (int sig : {SIGTERM, SIGINT}) {
        SCOPED_TRACE(strsignal(sig));
        const fs::path run = dir / "run";
        Background bg(apiary_bin() + " launch -n 2 -- train --set run.dir=" + run.string() +
                          " --set data.tokenizer=byte --set model.n_layer=1"
                          " --set train.batch_size=2 --set train.seq_len=32"
                          " --set train.steps=100000000 --set train.log_every=1",
                      (dir / "out.txt").string());
        ASSERT_TRUE(wait_until(
            [&] { return read_lines((run / "metrics.jsonl").string()).size() >= 2; }, 120))
            << bg.output();
        bg.signal(sig);
        EXPECT_EQ(bg.wait(), 130) << bg.output();
        EXPECT_NE(bg.output().find("interrupted after step"), std::string::npos) << bg.output();
        const auto r =
            run_command(apiary_bin() + " generate --run " + run.string() + " --tokens 1");
        EXPECT_EQ(r.exit_code, 0) << r.output;
        fs::remove_all(run);
    }
    fs::remove_all(dir);
}
