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

namespace {

// A run whose evaluation is long: a model of ~10M parameters on one thread,
// every held-out window of half the corpus evaluated after step 2 (about
// 30000 forward passes of 64 tokens: many minutes of work on any CPU).
std::string long_eval_run(const fs::path& run, int eval_batches) {
    return " train --set run.dir=" + run.string() +
           " --set data.tokenizer=byte --set data.val_fraction=0.5"
           " --set model.n_layer=6 --set model.n_embd=384 --set model.n_head=6"
           " --set train.threads=1 --set train.batch_size=1 --set train.seq_len=64"
           " --set train.steps=1000 --set train.log_every=1 --set train.eval_every=2"
           " --set train.eval_batches=" +
           std::to_string(eval_batches);
}

std::string read_text(const fs::path& p) {
    std::ifstream in(p);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

// Signals `bg` once step 1 is logged and step 2's evaluation runs; the run
// must end with the stop checkpoint of step 2 well before the evaluation
// could have finished, record no evaluation, and resume.
void expect_stop_during_eval(Background& bg, int sig, const fs::path& run,
                             const std::string& launcher) {
    ASSERT_TRUE(
        wait_until([&] { return read_lines((run / "metrics.jsonl").string()).size() >= 1; }, 300))
        << bg.output();
    // Step 2 takes a fraction of a second; a signal that lands in it instead
    // stops at the same step, with the evaluation given up at its first batch.
    std::this_thread::sleep_for(std::chrono::seconds(3));
    bg.signal(sig);
    // The evaluation alone needs many minutes; the stop checkpoint seconds.
    ASSERT_TRUE(bg.exited_within(60)) << "still running 60 s after the signal:\n" << bg.output();
    EXPECT_EQ(bg.wait(), 130) << bg.output();
    EXPECT_NE(bg.output().find("interrupted after step 2"), std::string::npos) << bg.output();
    EXPECT_EQ(read_text(run / "ckpt" / "latest"), "step_00000002");
    for (const auto& line : read_lines((run / "metrics.jsonl").string())) {
        EXPECT_EQ(line.find("eval_loss"), std::string::npos) << "an abandoned evaluation: " << line;
    }
    const auto r = run_command(launcher + " train --resume " + run.string() +
                               " --set train.steps=3 --set train.eval_batches=1 2>&1");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("resuming after step 2"), std::string::npos) << r.output;
}

}  // namespace

TEST(Signals, AStopDuringALongEvaluationSavesAtOnceAndResumes) {
    const fs::path dir =
        fs::temp_directory_path() / ("apiary_eval_stop_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
    for (int sig : {SIGTERM, SIGINT}) {
        SCOPED_TRACE(strsignal(sig));
        const fs::path run = dir / "run";
        Background bg(apiary_bin() + long_eval_run(run, 30000), (dir / "out.txt").string());
        expect_stop_during_eval(bg, sig, run, apiary_bin());
        fs::remove_all(run);
    }
    fs::remove_all(dir);
}

TEST(Signals, PipelineRanksGiveUpAnEvaluationAtTheSameBatch) {
    // The stages pass activations point to point inside every evaluation
    // batch: a rank leaving the evaluation alone would leave its peer
    // waiting for a message forever.
    const fs::path dir =
        fs::temp_directory_path() / ("apiary_eval_stop_pp_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
    const fs::path run = dir / "run";
    const std::string launch = apiary_bin() + " launch -n 2 --";
    Background bg(
        launch + long_eval_run(run, 30000) + " --set parallel.pp=2 --set train.grad_accum=2",
        (dir / "out.txt").string());
    expect_stop_during_eval(bg, SIGTERM, run, launch);
    fs::remove_all(dir);
}

TEST(Signals, EvalBatchesBeyondTheHeldOutSetAreRefusedBeforeTheRunStarts) {
    const fs::path dir =
        fs::temp_directory_path() / ("apiary_eval_range_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    const fs::path run = dir / "run";
    // Bounded: without the check the run would evaluate for days.
    const auto r =
        run_command("timeout 300 " + apiary_bin() + long_eval_run(run, 1000000000) + " 2>&1");
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("train.eval_batches = 1000000000"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("distinct batches"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("set train.eval_batches to at most"), std::string::npos) << r.output;
    EXPECT_FALSE(fs::exists(run)) << "the run directory was written before the check";
    fs::remove_all(dir);
}
