// Resume equals uninterrupted: a run "crashed" after its step-4 checkpoint
// and resumed ends bit-identical to one that ran straight through, in fp32
// and with the fp16 loss scaler's state carried across.

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/error.h"
#include "train/keys.h"
#include "train/trainer.h"

using namespace apiary;
namespace fs = std::filesystem;

namespace {

std::vector<char> read_file(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), {}};
}

void check_resume(const std::string& precision, const std::string& inject,
                  const std::vector<std::string>& extra = {}) {
    const fs::path dir =
        fs::temp_directory_path() / ("apiary_resume_" + precision + std::to_string(::getpid()));
    fs::create_directories(dir);
    core::Schema schema;
    core::add_shared_keys(schema);
    train::add_keys(schema);
    auto make = [&](const std::string& name) {
        core::Config c(schema);
        for (const char* kv :
             {"model.n_layer=2", "train.steps=8", "train.batch_size=2", "train.seq_len=32",
              "train.grad_accum=2", "train.warmup_steps=3", "train.ckpt_every=4",
              "train.eval_every=4", "train.eval_batches=2", "train.log_every=2"}) {
            c.set(kv);
        }
        c.set("train.precision=" + precision);
        c.set("debug.inject_overflow_steps=" + inject);
        for (const auto& kv : extra) c.set(kv);
        c.set("run.dir=" + (dir / name).string());
        return c;
    };
    auto straight = make("straight");
    train::run_training(straight, false);

    auto crashed = make("crashed");
    train::run_training(crashed, false);
    // Simulate a crash right after the step-4 checkpoint.
    fs::remove_all(dir / "crashed" / "ckpt" / "step_00000008");
    std::ofstream(dir / "crashed" / "ckpt" / "latest", std::ios::trunc) << "step_00000004";
    auto resumed = make("crashed");
    const auto s = train::resume_training(resumed);
    EXPECT_EQ(s.steps, 8);
    for (const char* f : {"rank_00000.safetensors"}) {
        const auto a = read_file(dir / "straight" / "ckpt" / "step_00000008" / f);
        const auto b = read_file(dir / "crashed" / "ckpt" / "step_00000008" / f);
        ASSERT_GT(a.size(), 1000u);
        EXPECT_TRUE(a == b) << f << " differs after resume (" << precision << ")";
    }
    fs::remove_all(dir);
}

}  // namespace

TEST(Resume, EqualsUninterruptedFp32) { check_resume("fp32", ""); }
TEST(Resume, EqualsUninterruptedFp16WithScalerState) { check_resume("fp16", "3,6"); }
// Experts, the sigmoid router's selection bias and its AdamW state resume
// with the rest (the checkpoint records the MoE shape).
TEST(Resume, EqualsUninterruptedMixtureOfExperts) {
    check_resume("fp32", "",
                 {"model.n_expert=4", "model.n_expert_active=2", "model.moe_ffn_hidden=64",
                  "model.moe_router=sigmoid", "model.n_shared_expert=1"});
}

TEST(Resume, FinishedRunNeedsMoreSteps) {
    const fs::path dir =
        fs::temp_directory_path() / ("apiary_resume_done" + std::to_string(::getpid()));
    core::Schema schema;
    core::add_shared_keys(schema);
    train::add_keys(schema);
    core::Config c(schema);
    for (const char* kv : {"model.n_layer=1", "train.steps=2", "train.batch_size=1",
                           "train.seq_len=16", "train.eval_batches=1"}) {
        c.set(kv);
    }
    c.set("run.dir=" + dir.string());
    train::run_training(c, true);
    try {
        train::resume_training(c);
        FAIL();
    } catch (const ConfigError& e) {
        EXPECT_NE(std::string(e.what()).find("already reached step 2"), std::string::npos);
    }
    fs::remove_all(dir);
}
