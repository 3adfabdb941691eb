#pragma once
// The fixture of the checkpoint tests that run `apiary train` under mpirun:
// a scratch folder per test, the arguments of a small model whose global
// batch is the same on 1, 2 or 4 ranks, and a run killed with SIGKILL after
// a checkpoint and resumed.

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/mount.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "../ckpt_util.h"
#include "../cli_util.h"
#include "../parallel/layout_util.h"

namespace apiary::testing {

namespace fs = std::filesystem;

class Checkpoints : public ::testing::Test {
  protected:
    void SetUp() override {
        dir_ = fs::temp_directory_path() /
               ("apiary_ckpt_" + std::to_string(::getpid()) + "_" +
                ::testing::UnitTest::GetInstance()->current_test_info()->name());
        fs::remove_all(dir_);
        fs::create_directories(dir_);
        runs_ = std::make_unique<LayoutRuns>(dir_);
    }
    void TearDown() override {
        if (mounted_) ::umount2((dir_ / "mnt").c_str(), MNT_DETACH);
        fs::remove_all(dir_);
    }
    // Global batch 8 sequences of 64 bytes, two micro-steps.
    static std::string args(int dp, const std::string& extra) {
        return "--set model.preset=tiny-llama --set model.n_layer=4 --set model.n_embd=128 "
               "--set model.n_head=8 --set model.n_kv_head=4 --set data.tokenizer=byte "
               "--set train.seq_len=64 --set train.grad_accum=2 --set train.log_every=1 "
               "--set train.eval_every=10 --set train.eval_batches=1 --set train.threads=1 "
               "--set train.warmup_steps=3 --set train.lr=1e-3 --set train.batch_size=" +
               std::to_string(4 / dp) + " " + extra;
    }
    std::string cmd(const std::string& name, int ranks, const std::string& a) const {
        const std::string launcher =
            ranks > 1 ? std::string(APIARY_MPIRUN) + " -n " + std::to_string(ranks) + " " : "";
        return launcher + apiary_bin() + " train --set run.dir=" + (dir_ / name).string() + " " + a;
    }
    void run(const std::string& name, int ranks, const std::string& a) {
        const auto r = run_command(cmd(name, ranks, a));
        ASSERT_EQ(r.exit_code, 0) << name << ":\n" << r.output;
    }
    std::string latest(const std::string& name) const {
        std::ifstream in(dir_ / name / "ckpt" / "latest");
        std::string s;
        std::getline(in, s);
        return s;
    }
    fs::path ckpt(const std::string& name, int step) const {
        return dir_ / name / "ckpt" / fmt::format("step_{:08d}", step);
    }
    // Trains `name` to 40 steps, killed with SIGKILL once its step-20
    // checkpoint is committed, then resumed to the end.
    void killed_and_resumed(const std::string& name, int ranks, const std::string& a) {
        const std::string full = a + " --set train.steps=40 --set train.ckpt_every=20";
        {
            Background bg(cmd(name, ranks, full), (dir_ / (name + ".out")).string());
            ASSERT_TRUE(wait_until([&] { return latest(name) == "step_00000020"; }, 180))
                << bg.output();
            // mpirun passes SIGKILL on to its ranks only by dying: kill them.
            run_command("pkill -KILL -f '[r]un.dir=" + (dir_ / name).string() + " '");
            bg.signal(SIGKILL);
            bg.wait();
        }
        // Killed mid-run: the last save is step 20's.
        ASSERT_EQ(latest(name), "step_00000020");
        const auto r = run_command(
            (ranks > 1 ? std::string(APIARY_MPIRUN) + " -n " + std::to_string(ranks) + " " : "") +
            apiary_bin() + " train --resume " + (dir_ / name).string());
        ASSERT_EQ(r.exit_code, 0) << r.output;
    }
    void expect_identical(const std::string& a, const std::string& b, int step) {
        EXPECT_EQ(runs_->series(a, "loss"), runs_->series(b, "loss")) << a << " vs " << b;
        EXPECT_EQ(runs_->series(a, "grad_norm"), runs_->series(b, "grad_norm"));
        EXPECT_EQ(checkpoint_tensors(ckpt(a, step)), checkpoint_tensors(ckpt(b, step)));
        EXPECT_EQ(checkpoint_tensors(ckpt(a, step), "adam_v"),
                  checkpoint_tensors(ckpt(b, step), "adam_v"));
    }

    fs::path dir_;
    std::unique_ptr<LayoutRuns> runs_;
    bool mounted_ = false;
};

}  // namespace apiary::testing
