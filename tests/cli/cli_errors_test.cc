// Bad input through the command line: each a one-line error naming the key,
// value or file, a non-zero exit, and nothing in an existing run directory
// overwritten.

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../cli_util.h"

using namespace apiary::testing;
namespace fs = std::filesystem;

namespace {

class CliErrors : public ::testing::Test {
  protected:
    void SetUp() override {
        dir_ = fs::temp_directory_path() /
               ("apiary_cli_" + std::to_string(::getpid()) + "_" +
                ::testing::UnitTest::GetInstance()->current_test_info()->name());
        fs::remove_all(dir_);
        fs::create_directories(dir_);
    }
    void TearDown() override { fs::remove_all(dir_); }

    // Shards of a small text under a BPE of `vocab` tokens (dir_/tok.json),
    // made with the CLI as a user would.
    fs::path make_shards(int vocab) {
        {
            std::ofstream out(dir_ / "corpus.txt");
            for (int i = 0; i < 2000; ++i) out << "And the word " << i << " was with them.\n";
        }
        const std::string corpus = (dir_ / "corpus.txt").string();
        const std::string tok = (dir_ / "tok.json").string();
        EXPECT_EQ(run_command(apiary_bin() + " tokenizer train --input " + corpus +
                              " --vocab-size " + std::to_string(vocab) + " --out " + tok)
                      .exit_code,
                  0);
        EXPECT_EQ(run_command(apiary_bin() + " data prepare --input " + corpus + " --tokenizer " +
                              tok + " --out " + (dir_ / "shards").string() + " --unit-kb 4")
                      .exit_code,
                  0);
        return dir_ / "shards";
    }

    // `apiary train` with a tiny, fast setup plus extra arguments.
    CommandResult train(const std::string& extra) {
        return run_command(apiary_bin() + " train --set run.dir=" + (dir_ / "run").string() +
                           " --set train.steps=2 --set train.batch_size=2 --set train.seq_len=16 " +
                           extra);
    }
    fs::path dir_;
};

void expect_error(const CommandResult& r, const std::string& fragment) {
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find(fragment), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("internal error"), std::string::npos) << r.output;
}

}  // namespace

TEST_F(CliErrors, UnknownKeySuggestsTheNearest) {
    expect_error(train("--set train.lr_max=1"), "unknown config key 'train.lr_max'");
    expect_error(train("--set model.n_layers=2"), "did you mean 'model.n_layer'");
}

TEST_F(CliErrors, WrongTypeAndRange) {
    expect_error(train("--set train.steps=many"), "train.steps must be an integer");
    expect_error(train("--set train.lr=-1"), "train.lr = -1.0 is out of range");
}

TEST_F(CliErrors, FreezePrefixThatNamesNoParameter) {
    expect_error(train("--set train.freeze=wte.,h.99."),
                 "train.freeze: 'h.99.' is the prefix of no parameter");
}

TEST_F(CliErrors, BadConfigFileNamesFileAndLine) {
    const fs::path cfg = dir_ / "bad.toml";
    std::ofstream(cfg) << "[train]\nsteps = 3\nbatch_size = \"x\"\n";
    const auto r = run_command(apiary_bin() + " train --config " + cfg.string());
    expect_error(r, "bad.toml:3");
    expect_error(r, "train.batch_size must be an integer");
}

TEST_F(CliErrors, InconsistentModelShape) {
    expect_error(train("--set model.n_head=5"),
                 "model.n_head = 5 does not divide model.n_embd = 192");
}

TEST_F(CliErrors, MissingCorpus) {
    expect_error(train("--set data.corpus=" + (dir_ / "nope.txt").string()), "nope.txt");
}

TEST_F(CliErrors, ExistingRunIsNotOverwritten) {
    fs::create_directories(dir_ / "run");
    std::ofstream(dir_ / "run" / "precious.txt") << "keep";
    expect_error(train(""), "already holds a run");
    // A bad config on top of an existing run changes nothing either.
    std::ofstream(dir_ / "run" / "config.toml") << "";
    std::ofstream(dir_ / "run" / "metrics.jsonl") << "";
    expect_error(train("--overwrite --set model.n_head=7"), "does not divide");
    std::ifstream in(dir_ / "run" / "precious.txt");
    std::string s;
    in >> s;
    EXPECT_EQ(s, "keep");
}

// Here (no GPU, or a build without CUDA) and on a GPU alike, train.device =
// cuda is refused by name before the run directory is made.
TEST_F(CliErrors, DeviceCudaRefusedBeforeTheRunDirectory) {
    const auto r = train("--set train.device=cuda");
    expect_error(r, "train.device = 'cuda'");
    EXPECT_FALSE(fs::exists(dir_ / "run")) << r.output;
    expect_error(train("--set train.device=tpu"), "train.device");
}

TEST_F(CliErrors, GenerateWithoutCheckpoint) {
    expect_error(run_command(apiary_bin() + " generate --run " + (dir_ / "none").string()),
                 "no such run directory");
    fs::create_directories(dir_ / "empty");
    expect_error(run_command(apiary_bin() + " generate --run " + (dir_ / "empty").string()),
                 "no checkpoint");
}

TEST_F(CliErrors, GenerateRejectsForeignCheckpoint) {
    const fs::path ck = dir_ / "foreign" / "ckpt" / "step_00000001";
    fs::create_directories(ck);
    std::ofstream(dir_ / "foreign" / "ckpt" / "latest") << "step_00000001";
    std::ofstream(ck / "manifest.json")
        << R"({"format": "something-else", "version": 2, "files": {}, "chunks": []})";
    expect_error(run_command(apiary_bin() + " generate --run " + (dir_ / "foreign").string()),
                 "not an apiary checkpoint");
}

TEST_F(CliErrors, GenerateRejectsTruncatedWeights) {
    // A real run, then its weights file cut short.
    ASSERT_EQ(train("").exit_code, 0);
    const fs::path w = dir_ / "run" / "ckpt" / "step_00000002" / "rank_00000.safetensors";
    ASSERT_TRUE(fs::exists(w));
    fs::resize_file(w, fs::file_size(w) / 2);
    expect_error(run_command(apiary_bin() + " generate --run " + (dir_ / "run").string()),
                 "rank_00000.safetensors: " + std::to_string(fs::file_size(w)) + " bytes");
}

TEST_F(CliErrors, UnsupportedLayoutIsRefusedBeforeWork) {
    expect_error(train("--set parallel.tp=2"), "world size 1 is not divisible by tp(2)");
    EXPECT_FALSE(fs::exists(dir_ / "run"));
}

TEST_F(CliErrors, DamagedCheckpointMetaIsRefusedNotRetrained) {
    ASSERT_EQ(train("").exit_code, 0);
    const fs::path manifest = dir_ / "run" / "ckpt" / "step_00000002" / "manifest.json";
    nlohmann::json m = nlohmann::json::parse(std::ifstream(manifest));
    m.erase("step");
    std::ofstream(manifest, std::ios::trunc) << m.dump();
    expect_error(run_command(apiary_bin() + " generate --run " + (dir_ / "run").string()),
                 "manifest.json: 'step' is missing");
    expect_error(run_command(apiary_bin() + " train --resume " + (dir_ / "run").string() +
                             " --set train.steps=4"),
                 "no earlier intact checkpoint");
    EXPECT_FALSE(fs::exists(dir_ / "run" / "ckpt" / "step_00000004"));
}

TEST_F(CliErrors, ResumeWithAnotherModelShapeIsRefused) {
    ASSERT_EQ(train("").exit_code, 0);
    expect_error(run_command(apiary_bin() + " train --resume " + (dir_ / "run").string() +
                             " --set train.steps=4 --set model.n_layer=2"),
                 "resume without changing model.*");
}

TEST_F(CliErrors, ResumeWithAnotherTokenizerIsRefused) {
    ASSERT_EQ(train("").exit_code, 0);
    expect_error(run_command(apiary_bin() + " train --resume " + (dir_ / "run").string() +
                             " --set train.steps=4 --set data.bpe_vocab_size=300"),
                 "the run was trained with tokenizer");
    EXPECT_FALSE(fs::exists(dir_ / "run" / "ckpt" / "step_00000004"));
}

TEST_F(CliErrors, CorpusThatIsADirectory) {
    expect_error(train("--set data.corpus=" + dir_.string()), "is a directory");
}

TEST_F(CliErrors, InterruptSavesACheckpointAndExits130) {
    // SIGINT after 2 s of a run far too long to finish: the step completes,
    // a checkpoint is saved, the exit code says the run did not complete,
    // and --resume continues from it.
    const auto r = run_command("timeout --preserve-status -s INT 2 " + apiary_bin() +
                               " train --set run.dir=" + (dir_ / "run").string() +
                               " --set train.steps=10000000 --set train.batch_size=1"
                               " --set train.seq_len=8 --set model.n_layer=1");
    EXPECT_EQ(r.exit_code, 130) << r.output;
    EXPECT_NE(r.output.find("interrupted after step"), std::string::npos) << r.output;
    std::ifstream latest(dir_ / "run" / "ckpt" / "latest");
    std::string name;
    latest >> name;
    ASSERT_FALSE(name.empty());
    const int64_t step = std::stoll(name.substr(5));
    EXPECT_GT(step, 0);
    const auto resumed = run_command(apiary_bin() + " train --resume " + (dir_ / "run").string() +
                                     " --set train.steps=" + std::to_string(step + 2));
    EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
    EXPECT_NE(resumed.output.find("resuming after step " + std::to_string(step)), std::string::npos)
        << resumed.output;
}

TEST_F(CliErrors, SequenceParallelWithoutTensorParallelIsRefused) {
    expect_error(train("--set parallel.sequence_parallel=true"), "needs tensor parallelism");
    EXPECT_FALSE(fs::exists(dir_ / "run"));
}

TEST_F(CliErrors, DataSourceWithoutManifest) {
    fs::create_directories(dir_ / "shards");
    expect_error(
        train("--set data.sources=" + (dir_ / "shards").string()),
        "data.sources: manifest '" + (dir_ / "shards" / "manifest.json").string() + "' not found");
    EXPECT_FALSE(fs::exists(dir_ / "run"));
}

TEST_F(CliErrors, TokenizerThatDidNotMakeTheShards) {
    const fs::path shards = make_shards(300);
    const fs::path other = dir_ / "other.json";
    ASSERT_EQ(
        run_command(apiary_bin() + " tokenizer train --input " + (dir_ / "corpus.txt").string() +
                    " --vocab-size 280 --out " + other.string())
            .exit_code,
        0);
    const auto r = train("--set data.sources=" + shards.string() +
                         " --set data.tokenizer_file=" + other.string());
    expect_error(r, (shards / "manifest.json").string() + "' was tokenized with tokenizer");
    expect_error(r, "data.tokenizer_file '" + other.string() + "' has hash");
    EXPECT_FALSE(fs::exists(dir_ / "run"));
}

TEST_F(CliErrors, TokenizerLargerThanTheModel) {
    const fs::path shards = make_shards(300);
    const auto r = train("--set data.sources=" + shards.string() + " --set model.vocab_size=260");
    expect_error(r, (shards / "manifest.json").string() +
                        ": the shards' tokenizer has 300 tokens, more than model.vocab_size = 260");
    EXPECT_FALSE(fs::exists(dir_ / "run"));
}

TEST_F(CliErrors, ByteTokenizerWithShardsIsRefused) {
    const fs::path shards = make_shards(300);
    expect_error(train("--set data.sources=" + shards.string() + " --set data.tokenizer=byte"),
                 "data.tokenizer = 'byte' applies to data.corpus");
    expect_error(train("--set data.curriculum_start=8"), "needs data.curriculum_steps > 0");
    EXPECT_FALSE(fs::exists(dir_ / "run"));
}

TEST_F(CliErrors, PlannerOnlySettingsAreRefusedByTheTrainer) {
    expect_error(train("--set parallel.cp=2"), "parallel.cp = 2: context parallelism");
    expect_error(train("--set parallel.ep=2"),
                 "parallel.ep = 2 needs a mixture-of-experts model (model.n_expert > 0)");
    expect_error(train("--set train.precision=fp8"), "modelled by `apiary plan` only");
    EXPECT_FALSE(fs::exists(dir_ / "run"));
}

TEST_F(CliErrors, MixtureOfExpertsLayoutsNotYetTrainedAreRefused) {
    const std::string moe = "--set model.n_expert=8 --set model.n_expert_active=2 ";
    expect_error(train(moe + "--set parallel.ep=2"),
                 "parallel.ep = 2 does not divide the 1 data-parallel ranks (parallel.dp)");
    expect_error(train(moe + "--set parallel.ep=3"),
                 "parallel.ep = 3 does not divide model.n_expert = 8");
    expect_error(train(moe + "--set parallel.tp=2"),
                 "parallel.tp = 2 with model.n_expert = 8: mixture-of-experts blocks train with "
                 "data, expert and pipeline parallelism and ZeRO 1-3 (not yet tensor parallel)");
    expect_error(train(moe + "--set train.precision=fp16"),
                 "train.precision = 'fp16' with model.n_expert = 8: mixture-of-experts blocks "
                 "train in fp32 or bf16 (not fp16)");
    expect_error(train(moe + "--set model.n_expert_active=9"),
                 "model.n_expert_active = 9 must be between 1 and model.n_expert = 8");
    expect_error(train(moe + "--set model.moe_capacity_factor=0"),
                 "model.moe_capacity_factor = 0: must be in (0, 1000]");
    expect_error(train("--set model.moe_router=sigmoid"), "set model.n_expert too");
    EXPECT_FALSE(fs::exists(dir_ / "run"));
}

TEST_F(CliErrors, MixtureOfExpertsHasNoHuggingFaceExport) {
    const auto r = train(
        "--set model.n_expert=4 --set model.n_expert_active=2 --set model.n_layer=1 "
        "--set model.n_embd=32 --set model.n_head=2 --set train.steps=1 --set train.ckpt_every=1");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    expect_error(run_command(apiary_bin() + " ckpt export " + (dir_ / "run").string() +
                             " --format hf --out " + (dir_ / "hf").string()),
                 "a mixture-of-experts model (model.n_expert = 4) has no Hugging Face export");
    EXPECT_FALSE(fs::exists(dir_ / "hf" / "model.safetensors"));
}
