// The trainer on token shards: prepared sources mixed by weight, a
// sequence-length curriculum, and resume equal to the uninterrupted run
// step by step (the same tokens, losses and learning rates, then the same
// parameters), with the loader's position carried in the checkpoint.

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/config.h"
#include "core/error.h"
#include "data/bpe_train.h"
#include "data/prepare.h"
#include "train/keys.h"
#include "train/trainer.h"

using namespace apiary;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

class TrainData : public ::testing::Test {
  protected:
    // Two prepared sources of one tokenizer, made once for the suite.
    static void SetUpTestSuite() {
        dir_ = fs::temp_directory_path() / ("apiary_traindata_" + std::to_string(::getpid()));
        fs::create_directories(dir_);
        {
            std::ofstream a(dir_ / "a.txt"), b(dir_ / "b.txt");
            for (int i = 0; i < 1500; ++i) {
                a << "And it came to pass in the year " << i << " that the king went out.\n";
                b << "Verse " << i << ": blessed are they that hear the word " << i % 7 << ".\n";
            }
        }
        const data::Tokenizer tok = data::train_bpe_on_files(
            {(dir_ / "a.txt").string(), (dir_ / "b.txt").string()}, {.vocab_size = 320});
        tok.save((dir_ / "tokenizer.json").string());
        for (const char* name : {"a", "b"}) {
            data::PrepareOptions o;
            o.inputs = {(dir_ / (std::string(name) + ".txt")).string()};
            o.tokenizer = (dir_ / "tokenizer.json").string();
            o.out = (dir_ / name).string();
            o.unit_bytes = 4096;
            o.val_fraction = 0.1;
            data::prepare(o);
        }
    }
    static void TearDownTestSuite() { fs::remove_all(dir_); }

    void SetUp() override {
        core::add_shared_keys(schema_);
        train::add_keys(schema_);
    }

    core::Config make(const std::string& name, const std::vector<std::string>& extra) {
        core::Config c(schema_);
        for (const char* kv : {"model.n_layer=1", "model.n_embd=64", "model.n_head=2",
                               "train.steps=8", "train.batch_size=2", "train.seq_len=32",
                               "train.grad_accum=2", "train.warmup_steps=3", "train.ckpt_every=4",
                               "train.eval_every=4", "train.eval_batches=2", "train.log_every=1"}) {
            c.set(kv);
        }
        c.set("data.sources=" + (dir_ / "a").string() + ":0.7," + (dir_ / "b").string() + ":0.3");
        c.set("data.tokenizer_file=" + (dir_ / "tokenizer.json").string());
        for (const auto& kv : extra) c.set(kv);
        c.set("run.dir=" + (dir_ / name).string());
        return c;
    }
    static std::vector<json> steps(const std::string& name) {
        std::vector<json> out;
        std::ifstream in(dir_ / name / "metrics.jsonl");
        std::string line;
        while (std::getline(in, line)) {
            const auto j = json::parse(line);
            if (j.contains("loss")) out.push_back(j);
        }
        return out;
    }
    static std::vector<char> read(const fs::path& p) {
        std::ifstream in(p, std::ios::binary);
        return {std::istreambuf_iterator<char>(in), {}};
    }

    // A run "crashed" after its step-4 checkpoint and resumed must log the
    // same steps as one run straight through, and end with the same bytes.
    void expect_resume_equals_uninterrupted(const std::string& tag,
                                            const std::vector<std::string>& extra) {
        train::run_training(make(tag + "_straight", extra), false);
        train::run_training(make(tag + "_crashed", extra), false);
        const fs::path ck = dir_ / (tag + "_crashed") / "ckpt";
        fs::remove_all(ck / "step_00000008");
        std::ofstream(ck / "latest", std::ios::trunc) << "step_00000004";
        // The interrupted run's log goes on to step 8; keep what it had at 4.
        const auto before = steps(tag + "_crashed");
        {
            std::ofstream out(dir_ / (tag + "_crashed") / "metrics.jsonl", std::ios::trunc);
            for (const auto& j : before) {
                if (j["step"].get<int>() <= 4) out << j.dump() << '\n';
            }
        }
        const auto s = train::resume_training(make(tag + "_crashed", extra));
        EXPECT_EQ(s.steps, 8);
        const auto a = steps(tag + "_straight"), b = steps(tag + "_crashed");
        ASSERT_EQ(a.size(), 8u);
        ASSERT_EQ(b.size(), 8u);
        for (size_t i = 0; i < a.size(); ++i) {
            for (const char* k : {"step", "batch_xxh64", "loss", "lr", "tokens"}) {
                EXPECT_EQ(a[i][k], b[i][k]) << tag << ": " << k << " at step " << i + 1;
            }
        }
        for (const char* f : {"rank_00000.safetensors"}) {
            const auto x = read(dir_ / (tag + "_straight") / "ckpt" / "step_00000008" / f);
            const auto y = read(dir_ / (tag + "_crashed") / "ckpt" / "step_00000008" / f);
            ASSERT_GT(x.size(), 1000u);
            EXPECT_TRUE(x == y) << tag << ": " << f << " differs after resume";
        }
    }

    core::Schema schema_;
    static fs::path dir_;
};
fs::path TrainData::dir_;

}  // namespace

TEST_F(TrainData, ResumeEqualsUninterruptedOnMixedSources) {
    expect_resume_equals_uninterrupted("mix", {});
    // The run keeps the tokenizer it trained with, and its vocabulary.
    EXPECT_EQ(read(dir_ / "mix_straight" / "tokenizer.json"), read(dir_ / "tokenizer.json"));
    std::ifstream meta(dir_ / "mix_straight" / "ckpt" / "step_00000008" / "manifest.json");
    const auto m = json::parse(meta);
    EXPECT_EQ(m["model"]["vocab_size"].get<int>(), 320);
    EXPECT_EQ(m["tokenizer"].get<std::string>(), "tokenizer.json");
    EXPECT_EQ(m["loader"]["step"].get<int>(), 8);
}

TEST_F(TrainData, ResumeEqualsUninterruptedMidCurriculum) {
    // The curriculum runs over steps 0-5: the crash at step 4 falls inside it.
    expect_resume_equals_uninterrupted("cur_tokens",
                                       {"data.curriculum_start=8", "data.curriculum_steps=6"});
    expect_resume_equals_uninterrupted(
        "cur_batch", {"data.curriculum_start=8", "data.curriculum_steps=6",
                      "data.curriculum_mode=batch", "train.lr_schedule_by=tokens"});
}

TEST_F(TrainData, CurriculumShapesTheSteps) {
    // tokens mode: T_t in {8, 16, 32} (divisors of 32), rows grow to match,
    // so every step trains on the same number of tokens.
    train::run_training(
        make("shape_tokens", {"data.curriculum_start=8", "data.curriculum_steps=6"}), false);
    int64_t prev = 0;
    for (const auto& j : steps("shape_tokens")) {
        EXPECT_EQ(j["tokens"].get<int64_t>() - prev, 2 * 2 * 32) << j.dump();
        prev = j["tokens"].get<int64_t>();
    }
    // batch mode: B rows of T_t = 8 + 24 t / 6, then 32; by tokens, warmup
    // (3 full steps = 384 tokens) stretches over the short early steps.
    train::run_training(
        make("shape_batch", {"data.curriculum_start=8", "data.curriculum_steps=6",
                             "data.curriculum_mode=batch", "train.lr_schedule_by=tokens"}),
        false);
    const auto b = steps("shape_batch");
    ASSERT_EQ(b.size(), 8u);
    prev = 0;
    for (int64_t t = 0; t < 8; ++t) {
        const int64_t T = t < 6 ? 8 + 24 * t / 6 : 32;
        EXPECT_EQ(b[t]["tokens"].get<int64_t>() - prev, 2 * 2 * T) << "step " << t + 1;
        prev = b[t]["tokens"].get<int64_t>();
    }
    // Tokens after steps 1-3: 32, 80, 144 of 384: still warming up at step 3,
    // where the step clock would have reached the peak.
    const double peak = 2e-3;
    EXPECT_NEAR(b[2]["lr"].get<double>(), peak * 144 / 384, 1e-12);
    EXPECT_LT(b[2]["lr"].get<double>(), peak);
}

TEST_F(TrainData, ChangedSourcesAreRefusedOnResume) {
    train::run_training(make("changed", {"train.steps=2", "train.ckpt_every=0"}), false);
    auto c = make("changed", {"train.steps=4"});
    c.set("data.sources=" + (dir_ / "a").string());
    try {
        train::resume_training(c);
        FAIL() << "resumed on other sources";
    } catch (const ConfigError& e) {
        EXPECT_NE(std::string(e.what()).find("loader state was saved with sources"),
                  std::string::npos)
            << e.what();
    }
}
