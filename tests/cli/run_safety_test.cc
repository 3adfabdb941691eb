// What a run directory protects: --overwrite never removes what is not a
// run (nor the working directory), one process trains in a directory at a
// time, a full disk under metrics.jsonl is loud and leaves no broken line,
// and checkpoints are checked (checksums, tensors, integers, steps), kept
// (train.ckpt_keep) and cleaned (partial saves) as documented.

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/mount.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../cli_util.h"
#include "ckpt/safetensors.h"
#include "ckpt/sharded.h"

using namespace apiary::testing;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

class RunSafety : public ::testing::Test {
  protected:
    void SetUp() override {
        dir_ = fs::temp_directory_path() /
               ("apiary_safety_" + std::to_string(::getpid()) + "_" +
                ::testing::UnitTest::GetInstance()->current_test_info()->name());
        fs::remove_all(dir_);
        fs::create_directories(dir_);
    }
    void TearDown() override {
        if (mounted_) ::umount2((dir_ / "mnt").c_str(), MNT_DETACH);
        fs::remove_all(dir_);
    }

    // A small, fast run on the King James Bible as bytes.
    static std::string train_cmd(const fs::path& run, const std::string& extra) {
        return apiary_bin() + " train --set run.dir=" + run.string() +
               " --set data.tokenizer=byte --set model.n_layer=1 --set train.batch_size=2"
               " --set train.seq_len=32 --set train.eval_batches=1 --set train.log_every=1 " +
               extra;
    }
    CommandResult train(const std::string& name, const std::string& extra) {
        return run_command(train_cmd(dir_ / name, extra));
    }
    static json read_json(const fs::path& p) {
        std::ifstream in(p);
        return json::parse(in);
    }
    static void write_json(const fs::path& p, const json& j) { std::ofstream(p) << j.dump(2); }
    // Steps of metrics.jsonl's training records (those with a loss), in order.
    static std::vector<int64_t> logged_steps(const fs::path& run) {
        std::vector<int64_t> steps;
        for (const auto& line : read_lines((run / "metrics.jsonl").string())) {
            const json j = json::parse(line);
            if (j.contains("loss")) steps.push_back(j["step"].get<int64_t>());
        }
        return steps;
    }

    fs::path dir_;
    bool mounted_ = false;
};

void expect_error(const CommandResult& r, const std::string& fragment) {
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find(fragment), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("internal error"), std::string::npos) << r.output;
}

}  // namespace

TEST_F(RunSafety, OverwriteRefusesAFolderThatIsNotARun) {
    fs::create_directories(dir_ / "papers");
    std::ofstream(dir_ / "papers" / "thesis.tex") << "years of work";
    expect_error(train("papers", "--overwrite --set train.steps=2"),
                 "is not an apiary run directory");
    EXPECT_TRUE(fs::exists(dir_ / "papers" / "thesis.tex"));
}

TEST_F(RunSafety, OverwriteNeverRemovesTheWorkingDirectoryOrItsParent) {
    ASSERT_EQ(train("run", "--set train.steps=2").exit_code, 0);
    const std::string in_run = "cd " + (dir_ / "run").string() + " && ";
    for (const char* target : {".", "..", "../run"}) {
        const auto r =
            run_command(in_run + apiary_bin() + " train --overwrite --set run.dir=" + target +
                        " --set train.steps=2");
        expect_error(r, "is the working directory or holds it");
    }
    EXPECT_TRUE(fs::exists(dir_ / "run" / "ckpt" / "latest"));
}

TEST_F(RunSafety, OverwriteReplacesARunAndLeavesOtherFiles) {
    ASSERT_EQ(train("run", "--set train.steps=4 --set train.ckpt_every=2").exit_code, 0);
    std::ofstream(dir_ / "run" / "notes.txt") << "mine";
    const auto r = train("run", "--overwrite --set train.steps=1");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_TRUE(fs::exists(dir_ / "run" / "notes.txt"));
    EXPECT_FALSE(fs::exists(dir_ / "run" / "ckpt" / "step_00000002"));
    EXPECT_EQ(logged_steps(dir_ / "run"), std::vector<int64_t>{1});
}

TEST_F(RunSafety, ASecondProcessIsRefusedWithTheHoldersPid) {
    const fs::path run = dir_ / "run";
    Background bg(train_cmd(run, "--set train.steps=100000000"), (dir_ / "out.txt").string());
    ASSERT_TRUE(wait_until([&] { return fs::exists(run / "metrics.jsonl"); }, 60)) << bg.output();
    const std::string holder = "pid " + std::to_string(bg.pid());
    expect_error(run_command(apiary_bin() + " train --resume " + run.string()), holder);
    expect_error(train("run", "--overwrite --set train.steps=2"), holder);
    bg.signal(SIGINT);
    EXPECT_EQ(bg.wait(), 130) << bg.output();
    // Free again: the resume continues.
    const auto latest = read_lines((run / "ckpt" / "latest").string());
    ASSERT_EQ(latest.size(), 1u);
    const int64_t step = std::stoll(latest[0].substr(5));
    const auto r = run_command(apiary_bin() + " train --resume " + run.string() +
                               " --set train.steps=" + std::to_string(step + 1));
    EXPECT_EQ(r.exit_code, 0) << r.output;
}

TEST_F(RunSafety, AFullDiskUnderMetricsIsLoudAndLeavesNoBrokenLine) {
    if (::geteuid() != 0) GTEST_SKIP() << "mounting a small tmpfs needs root";
    const fs::path mnt = dir_ / "mnt";
    fs::create_directories(mnt);
    ASSERT_EQ(::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=16m"), 0) << std::strerror(errno);
    mounted_ = true;
    const fs::path run = mnt / "run";
    Background bg(train_cmd(run, "--set train.steps=100000000"), (dir_ / "out.txt").string());
    const auto lines = [&] { return read_lines((run / "metrics.jsonl").string()).size(); };
    ASSERT_TRUE(wait_until([&] { return lines() >= 3; }, 60)) << bg.output();
    {
        // Fill the file system to the last byte.
        std::ofstream fill(mnt / "fill", std::ios::binary);
        const std::string block(4096, 'x');
        while (fill.write(block.data(), std::streamsize(block.size())) && fill.flush()) {
        }
        for (int i = 0; i < 4096 && fill.write("x", 1) && fill.flush(); ++i) {
        }
    }
    ASSERT_TRUE(
        wait_until([&] { return bg.output().find("write failed") != std::string::npos; }, 60))
        << bg.output();
    fs::remove(mnt / "fill");
    const size_t after = lines();
    ASSERT_TRUE(wait_until([&] { return lines() >= after + 3; }, 60)) << bg.output();
    bg.signal(SIGINT);
    EXPECT_EQ(bg.wait(), 130) << bg.output();
    const std::string out = bg.output();
    EXPECT_NE(out.find("metrics.jsonl: write failed (No space left on device)"), std::string::npos)
        << out;
    EXPECT_NE(out.find("could not be written to"), std::string::npos) << out;
    // Every line is one whole JSON object, and the steps logged before and
    // after the gap are in order.
    std::vector<int64_t> steps;
    for (const auto& line : read_lines((run / "metrics.jsonl").string())) {
        const json j = json::parse(line, nullptr, false);
        ASSERT_FALSE(j.is_discarded()) << "broken line: " << line;
        if (j.contains("loss")) steps.push_back(j["step"].get<int64_t>());
    }
    EXPECT_TRUE(std::is_sorted(steps.begin(), steps.end()));
    EXPECT_TRUE(fs::exists(run / "ckpt" / "latest"));
}

TEST_F(RunSafety, AFlippedByteIsDetectedAndThePreviousGoodCheckpointResumes) {
    const fs::path run = dir_ / "run";
    ASSERT_EQ(train("run", "--set train.steps=20 --set train.ckpt_every=10").exit_code, 0);
    const fs::path file = run / "ckpt" / "step_00000020" / "rank_00000.safetensors";
    {
        // One bit of one weight of the first block's attention.
        const apiary::ckpt::SafetensorsFile st(file.string(), true);
        const auto& e = st.entry("param/h.0.attn.c_attn.weight/0");
        std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
        f.seekg(std::streamoff(e.file_offset + 40));
        char c = 0;
        f.read(&c, 1);
        c ^= 0x10;
        f.seekp(std::streamoff(e.file_offset + 40));
        f.write(&c, 1);
    }
    expect_error(run_command(apiary_bin() + " generate --run " + run.string() + " --tokens 2"),
                 "param tensor 'h.0.attn.c_attn.weight' elements [0, ");
    expect_error(run_command(apiary_bin() + " ckpt verify " + run.string()),
                 file.string() + ": xxh64");
    const auto r =
        run_command(apiary_bin() + " train --resume " + run.string() + " --set train.steps=25");
    expect_error(r, "does not match");
    expect_error(r, "step_00000010 (step 10) is intact");
    expect_error(r, "--resume-from-previous-good");
    const auto good = run_command(apiary_bin() + " train --resume " + run.string() +
                                  " --resume-from-previous-good --set train.steps=25");
    ASSERT_EQ(good.exit_code, 0) << good.output;
    EXPECT_NE(good.output.find("resuming after step 10"), std::string::npos) << good.output;
    // Steps 11-20 were logged by the first run and again by the resumed one:
    // the file holds each step once.
    std::vector<int64_t> want(25);
    for (int i = 0; i < 25; ++i) want[size_t(i)] = i + 1;
    EXPECT_EQ(logged_steps(run), want);
}

TEST_F(RunSafety, GenerateRefusesATensorTheModelDoesNotHave) {
    const fs::path run = dir_ / "run";
    ASSERT_EQ(train("run", "--set train.steps=2").exit_code, 0);
    const fs::path ck = run / "ckpt" / "step_00000002";
    // A well-formed chunk of a tensor no such model has, in a file of its own.
    const float extra[4] = {1, 2, 3, 4};
    apiary::ckpt::Chunk chunk;
    chunk.tensor = "h.99.attn.c_attn.weight";
    chunk.kind = "param";
    chunk.place.global_shape = chunk.place.local_shape = {2, 2};
    chunk.count = 4;
    chunk.data = extra;
    const json part = apiary::ckpt::write_chunks(ck.string(), "extra.safetensors", {chunk});
    json manifest = read_json(ck / "manifest.json");
    manifest["files"]["extra.safetensors"] = {{"bytes", part["bytes"]}, {"xxh64", part["xxh64"]}};
    manifest["chunks"].push_back(part["chunks"][0]);
    write_json(ck / "manifest.json", manifest);
    expect_error(run_command(apiary_bin() + " generate --run " + run.string() + " --tokens 2"),
                 "tensor 'h.99.attn.c_attn.weight' is not part of this model");
}

TEST_F(RunSafety, MetaIntegersAreRangeChecked) {
    const fs::path run = dir_ / "run";
    ASSERT_EQ(train("run", "--set train.steps=2").exit_code, 0);
    const fs::path meta_path = run / "ckpt" / "step_00000002" / "manifest.json";
    json meta = read_json(meta_path);
    // 2^32 + 1 layers would read as 1 through a 32-bit conversion.
    meta["model"]["n_layer"] = (int64_t(1) << 32) + 1;
    write_json(meta_path, meta);
    expect_error(run_command(apiary_bin() + " generate --run " + run.string() + " --tokens 2"),
                 "'n_layer' = 4294967297 is not an integer in");
}

TEST_F(RunSafety, AStepTheOptimizerDisagreesWithIsRefused) {
    const fs::path run = dir_ / "run";
    ASSERT_EQ(train("run", "--set train.steps=4").exit_code, 0);
    const fs::path meta_path = run / "ckpt" / "step_00000004" / "manifest.json";
    json meta = read_json(meta_path);
    meta["loss_scaler"]["skipped_steps"] = 3;
    write_json(meta_path, meta);
    expect_error(
        run_command(apiary_bin() + " train --resume " + run.string() + " --set train.steps=6"),
        "the optimizer has taken 4 steps, but the checkpoint says step 4 with 3 skipped");
}

TEST_F(RunSafety, CheckpointKeepRemovesOlderOnesAndPartialSavesGo) {
    const fs::path run = dir_ / "run";
    ASSERT_EQ(train("run",
                    "--set train.steps=20 --set train.ckpt_every=5 --set "
                    "train.ckpt_keep=2")
                  .exit_code,
              0);
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(run / "ckpt")) {
        names.push_back(e.path().filename().string());
    }
    std::sort(names.begin(), names.end());
    EXPECT_EQ(names, (std::vector<std::string>{"latest", "step_00000015", "step_00000020"}));
    // A crash mid-save leaves a folder without meta.json: the next save
    // removes it.
    fs::create_directories(run / "ckpt" / "step_00000022");
    std::ofstream(run / "ckpt" / "step_00000022" / ".model.safetensors.tmp") << "partial";
    const auto r =
        run_command(apiary_bin() + " train --resume " + run.string() + " --set train.steps=21");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_FALSE(fs::exists(run / "ckpt" / "step_00000022"));
    EXPECT_TRUE(fs::exists(run / "ckpt" / "step_00000021" / "manifest.json"));
    EXPECT_FALSE(fs::exists(run / "ckpt" / "step_00000015"));
}

TEST_F(RunSafety, OutOfMemoryNamesTheAllocation) {
    // gpt2-124m's activations for 64 x 1024 tokens are tens of GiB: more than
    // the address space allowed here.
    const auto r = run_command("ulimit -v 3000000 && " +
                               train_cmd(dir_ / "run",
                                         "--set model.preset=gpt2-124m --set model.n_layer=12 "
                                         "--set train.batch_size=64 --set train.seq_len=1024"));
    expect_error(r, "out of memory: allocating");
    expect_error(r, "of activations (f32 tensor");
    EXPECT_FALSE(fs::exists(dir_ / "run"));
}

TEST_F(RunSafety, GenerateRefusesANanTemperature) {
    const fs::path run = dir_ / "run";
    ASSERT_EQ(train("run", "--set train.steps=1").exit_code, 0);
    expect_error(
        run_command(apiary_bin() + " generate --run " + run.string() + " --temperature nan"),
        "--temperature = nan");
}
