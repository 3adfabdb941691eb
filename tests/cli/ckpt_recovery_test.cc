// Recovery from damage, through the real binary, for each kind of save
// (synchronous, asynchronous, incremental): a damaged `latest` (empty,
// garbage, naming a path outside ckpt/, deleted) and a damaged newest
// checkpoint (a flipped digit of a chunk's hash in the manifest, a
// truncated file, one corrupted data byte). `--resume` refuses and names
// the intact checkpoint and the flag; `ckpt verify` on the run directory
// reports the damage and the intact one; `--resume-from-previous-good` and
// `--auto-resume` continue from the newest checkpoint that verifies, and
// end bit-identical to a run that was never interrupted. Also: periodic
// asynchronous saves record the step they snapshot (issue 24's repro),
// and `ckpt verify` checks the counters that resume checks.

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/mount.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>

#include "../ckpt_util.h"
#include "../cli_util.h"

using namespace apiary::testing;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// A one-layer model that trains in milliseconds a step. min_lr = lr: the
// schedule does not depend on train.steps, so a run continued to a higher
// train.steps equals one that was given it from the start.
const std::string kArgs =
    "--set model.preset=tiny-llama --set model.n_layer=1 --set model.n_embd=32 "
    "--set model.n_head=2 --set model.n_kv_head=1 --set data.tokenizer=byte "
    "--set train.seq_len=32 --set train.batch_size=2 --set train.log_every=1 "
    "--set train.eval_every=100 --set train.eval_batches=1 --set train.threads=1 "
    "--set train.warmup_steps=2 --set train.lr=1e-3 --set train.min_lr=1e-3 ";

std::string mode_args(const std::string& mode) {
    if (mode == "async") return "--set train.ckpt_async=true ";
    if (mode == "incremental") return "--set train.ckpt_incremental=true ";
    return "";
}

std::string step_dir(int step) { return fmt::format("step_{:08d}", step); }

class Runs : public ::testing::Test {
  protected:
    void SetUp() override {
        std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
        for (char& c : name) c = c == '/' ? '_' : c;
        dir_ = fs::temp_directory_path() /
               ("apiary_recovery_" + std::to_string(::getpid()) + "_" + name);
        fs::remove_all(dir_);
        fs::create_directories(dir_);
    }
    void TearDown() override { fs::remove_all(dir_); }

    std::string train(const std::string& run, const std::string& extra) const {
        return apiary_bin() + " train --set run.dir=" + (dir_ / run).string() + " " + kArgs + extra;
    }
    void run_ok(const std::string& cmd) const {
        const auto r = run_command(cmd);
        ASSERT_EQ(r.exit_code, 0) << cmd << ":\n" << r.output;
    }
    fs::path ckpt(const std::string& run, int step) const {
        return dir_ / run / "ckpt" / step_dir(step);
    }
    // The damaged run's step-8 checkpoint equals the uninterrupted run's.
    void expect_equals_straight(const std::string& run) const {
        EXPECT_EQ(checkpoint_tensors(ckpt("straight", 8)), checkpoint_tensors(ckpt(run, 8))) << run;
        EXPECT_EQ(checkpoint_tensors(ckpt("straight", 8), "adam_v"),
                  checkpoint_tensors(ckpt(run, 8), "adam_v"))
            << run;
    }
    // A file holding data of the step-6 checkpoint only: its rank file, or
    // (incremental) a piece that step 4 does not share.
    fs::path data_file(const std::string& run) const {
        const fs::path c6 = ckpt(run, 6);
        if (fs::exists(c6 / "rank_00000.safetensors")) return c6 / "rank_00000.safetensors";
        // (The manifests are kept: a range-for over a temporary's member dangles.)
        const json m4 = checkpoint_manifest(ckpt(run, 4)), m6 = checkpoint_manifest(c6);
        std::set<std::string> older;
        for (const auto& c : m4["chunks"]) {
            for (const auto& h : c["pieces"]) older.insert(h.get<std::string>());
        }
        std::string piece;
        for (const auto& c : m6["chunks"]) {
            for (const auto& h : c["pieces"]) {
                if (!older.count(h.get<std::string>())) piece = h.get<std::string>();
            }
        }
        for (const auto& e : fs::recursive_directory_iterator(dir_ / run / "ckpt" / "blobs")) {
            if (e.path().filename() == piece) return e.path();
        }
        ADD_FAILURE() << "no piece of step 6 alone in " << run;
        return {};
    }

    fs::path dir_;
};

class Recovery : public Runs, public ::testing::WithParamInterface<std::string> {
  protected:
    struct Damage {
        std::string name;
        std::function<void(const std::string& run)> apply;
        int intact;  // the checkpoint to fall back to
    };
    // Runs `base` (saves at steps 2, 4 and 6) and the uninterrupted run to
    // step 8, then for each damage: a copy of `base` damaged, refused by
    // --resume and reported by `ckpt verify`, continued by
    // --resume-from-previous-good and (another copy) by --auto-resume.
    void check(const std::vector<Damage>& damages) {
        const std::string mode = mode_args(GetParam());
        run_ok(train("base", mode + "--set train.steps=6 --set train.ckpt_every=2"));
        run_ok(train("straight", "--set train.steps=8"));
        for (const auto& d : damages) {
            SCOPED_TRACE(d.name);
            const std::string run = "r_" + d.name, again = "a_" + d.name;
            fs::copy(dir_ / "base", dir_ / run, fs::copy_options::recursive);
            d.apply(run);
            fs::copy(dir_ / run, dir_ / again, fs::copy_options::recursive);
            const std::string intact = ckpt(run, d.intact).string();
            const auto refused = run_command(apiary_bin() + " train --resume " +
                                             (dir_ / run).string() + " --set train.steps=8");
            EXPECT_NE(refused.exit_code, 0) << refused.output;
            EXPECT_NE(refused.output.find(fmt::format("{} (step {}) is intact", intact, d.intact)),
                      std::string::npos)
                << refused.output;
            EXPECT_NE(refused.output.find("--resume-from-previous-good"), std::string::npos);
            EXPECT_EQ(refused.output.find("has not saved one yet"), std::string::npos);
            const auto verify = run_command(apiary_bin() + " ckpt verify " + (dir_ / run).string());
            EXPECT_NE(verify.exit_code, 0) << verify.output;
            EXPECT_NE(verify.output.find(intact + ": OK"), std::string::npos) << verify.output;
            EXPECT_EQ(verify.output.find((dir_ / run / "manifest.json").string()),
                      std::string::npos)
                << verify.output;
            const auto good =
                run_command(apiary_bin() + " train --resume " + (dir_ / run).string() +
                            " --resume-from-previous-good --set train.steps=8");
            ASSERT_EQ(good.exit_code, 0) << good.output;
            EXPECT_NE(good.output.find("resuming from " + intact), std::string::npos)
                << good.output;
            expect_equals_straight(run);
            const auto automatic = run_command(train(again, mode + "--set train.steps=8 "
                                                                   "--set train.ckpt_every=2 "
                                                                   "--auto-resume"));
            ASSERT_EQ(automatic.exit_code, 0) << automatic.output;
            EXPECT_NE(automatic.output.find("resuming from " + ckpt(again, d.intact).string()),
                      std::string::npos)
                << automatic.output;
            expect_equals_straight(again);
        }
    }
};

void write_latest(const fs::path& run, const std::string& text) {
    std::ofstream(run / "ckpt" / "latest", std::ios::trunc | std::ios::binary) << text;
}

}  // namespace

TEST_P(Recovery, ADamagedLatestFallsBackToTheNewestIntactCheckpoint) {
    auto latest = [&](const std::string& text) {
        return [this, text](const std::string& run) { write_latest(dir_ / run, text); };
    };
    check({{"empty", latest(""), 6},
           {"garbage", latest(std::string("\x01\xfe garbage \x7f\n", 13)), 6},
           {"outside", latest("../../outside/step_00000006"), 6},
           {"deleted",
            [this](const std::string& run) { fs::remove(dir_ / run / "ckpt" / "latest"); }, 6}});
}

TEST_P(Recovery, ADamagedNewestCheckpointFallsBackToThePreviousOne) {
    auto flip_chunk_hash = [this](const std::string& run) {
        const fs::path c6 = ckpt(run, 6);
        json m = checkpoint_manifest(c6);
        std::string h = m["chunks"][3]["xxh64"].get<std::string>();
        h[5] = h[5] == '0' ? '1' : '0';
        m["chunks"][3]["xxh64"] = h;
        std::ofstream(c6 / "manifest.json", std::ios::trunc) << m.dump();
    };
    auto truncate = [this](const std::string& run) {
        const fs::path f = data_file(run);
        fs::resize_file(f, fs::file_size(f) / 2);
    };
    auto corrupt_byte = [this](const std::string& run) {
        const fs::path f = data_file(run);
        std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
        const auto at = std::streamoff(fs::file_size(f) / 2);
        io.seekg(at);
        const char c = char(io.get() ^ 0x10);
        io.seekp(at);
        io.put(c);
    };
    check({{"chunk_hash", flip_chunk_hash, 4},
           {"truncated", truncate, 4},
           {"data_byte", corrupt_byte, 4}});
}

INSTANTIATE_TEST_SUITE_P(Saves, Recovery, ::testing::Values("sync", "async", "incremental"),
                         [](const auto& info) { return info.param; });

class Counters : public Runs {};

// Issue 24's repro: periodic asynchronous saves every 7 steps; the run goes
// back to step 7's and continues.
TEST_F(Counters, PeriodicAsyncSavesResumeFromAnyOfThem) {
    run_ok(train("async",
                 "--set train.steps=35 --set train.ckpt_every=7 "
                 "--set train.ckpt_async=true"));
    for (int step : {7, 14, 21, 28, 35}) {
        const json m = checkpoint_manifest(ckpt("async", step));
        EXPECT_EQ(m["optimizer_steps"], step) << step;
        EXPECT_EQ(m["tokens"], int64_t(step) * 2 * 32) << step;
        EXPECT_EQ(m["loader"]["step"], step) << step;
    }
    run_ok(apiary_bin() + " ckpt verify " + ckpt("async", 7).string());
    fs::copy(dir_ / "async", dir_ / "resumed", fs::copy_options::recursive);
    write_latest(dir_ / "resumed", step_dir(7));
    run_ok(apiary_bin() + " train --resume " + (dir_ / "resumed").string() +
           " --set train.steps=8");
    run_ok(train("straight", "--set train.steps=8"));
    EXPECT_EQ(checkpoint_tensors(ckpt("straight", 8)), checkpoint_tensors(ckpt("resumed", 8)));
}

// `ckpt verify` refuses what resume refuses: counters that disagree.
TEST_F(Counters, VerifyChecksTheCountersResumeChecks) {
    run_ok(train("r", "--set train.steps=4 --set train.ckpt_every=2"));
    const fs::path c4 = ckpt("r", 4);
    const json good = checkpoint_manifest(c4);
    auto expect_refused = [&](const std::function<void(json&)>& edit, const std::string& what) {
        json m = good;
        edit(m);
        std::ofstream(c4 / "manifest.json", std::ios::trunc) << m.dump();
        for (const std::string& cmd :
             {apiary_bin() + " ckpt verify " + c4.string(),
              apiary_bin() + " train --resume " + (dir_ / "r").string() + " --set train.steps=6"}) {
            const auto r = run_command(cmd);
            EXPECT_NE(r.exit_code, 0) << cmd << "\n" << r.output;
            EXPECT_NE(r.output.find(what), std::string::npos) << cmd << "\n" << r.output;
        }
    };
    expect_refused([](json& m) { m["optimizer_steps"] = 6; },
                   "the optimizer has taken 6 steps, but the checkpoint says step 4 with 0 "
                   "skipped (checkpoint damaged)");
    expect_refused([](json& m) { m["loader"]["step"] = 5; },
                   "the loader state is at batch 5, the checkpoint at step 4 with 0 batches "
                   "skipped (checkpoint damaged)");
    expect_refused([](json& m) { m["loss_scaler"]["skipped_steps"] = 1; },
                   "the optimizer has taken 4 steps, but the checkpoint says step 4 with 1 "
                   "skipped");
    std::ofstream(c4 / "manifest.json", std::ios::trunc) << good.dump();
    run_ok(apiary_bin() + " ckpt verify " + c4.string());
}

// A final save that fails with no earlier checkpoint does not claim one.
TEST_F(Counters, AFailedFirstSaveSaysThereIsNoEarlierCheckpoint) {
    if (::geteuid() != 0) GTEST_SKIP() << "mounting a small tmpfs needs root";
    // Room for the run's own files, not for a checkpoint (about 400 kB).
    const fs::path mnt = dir_ / "mnt";
    fs::create_directories(mnt);
    ASSERT_EQ(::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=200k"), 0) << std::strerror(errno);
    const auto r = run_command(apiary_bin() + " train --set run.dir=" + (mnt / "run").string() +
                               " " + kArgs + "--set train.steps=2");
    ::umount2(mnt.c_str(), MNT_DETACH);
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("the checkpoint of step 2 failed"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("stays the latest"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("still in"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("the run has no checkpoint to resume from"), std::string::npos)
        << r.output;
}
