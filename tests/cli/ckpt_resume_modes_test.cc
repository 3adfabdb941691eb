// Kill -9 and resume with asynchronous and with incremental saves, on one
// rank and on four (ZeRO-3): bit-identical to the run that was never
// interrupted, as with synchronous saves (checkpoint_test.cc). And a
// two-rank run whose newest checkpoint or `latest` is damaged continues
// from the newest one that verifies.

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "checkpoint_fixture.h"

using namespace apiary::testing;
namespace fs = std::filesystem;
using nlohmann::json;

TEST_F(Checkpoints, KilledAndResumedRunsWithAsyncOrIncrementalSavesEqualUninterruptedOnes) {
    const std::vector<std::tuple<std::string, int, std::string>> layouts = {
        {"one", 1, args(1, "")},
        {"zero3", 4, args(4, "--set parallel.zero_stage=3")},
    };
    const std::vector<std::pair<std::string, std::string>> saves = {
        {"async", " --set train.ckpt_async=true"},
        {"incremental", " --set train.ckpt_incremental=true"},
    };
    for (const auto& [name, ranks, a] : layouts) {
        run(name + "_straight", ranks, a + " --set train.steps=40");
        for (const auto& [save, extra] : saves) {
            SCOPED_TRACE(name + " " + save);
            killed_and_resumed(name + "_" + save, ranks, a + extra);
            expect_identical(name + "_straight", name + "_" + save, 40);
        }
    }
}

TEST_F(Checkpoints, TwoRanksFallBackFromADamagedCheckpointOrLatest) {
    // min_lr = lr: continued to step 6, the run equals one given 6 steps.
    const std::string a = args(2, "--set train.min_lr=1e-3 --set train.ckpt_async=true");
    run("straight", 2, a + " --set train.steps=6");
    run("r", 2, a + " --set train.steps=4 --set train.ckpt_every=2");
    fs::copy(dir_ / "r", dir_ / "l", fs::copy_options::recursive);
    // A flipped digit of one chunk's hash in step 4's manifest.
    json m = checkpoint_manifest(ckpt("r", 4));
    std::string h = m["chunks"][1]["xxh64"].get<std::string>();
    h[3] = h[3] == '0' ? '1' : '0';
    m["chunks"][1]["xxh64"] = h;
    std::ofstream(ckpt("r", 4) / "manifest.json", std::ios::trunc) << m.dump();
    const auto r =
        run_command(std::string(APIARY_MPIRUN) + " -n 2 " + apiary_bin() + " train --resume " +
                    (dir_ / "r").string() + " --resume-from-previous-good --set train.steps=6");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("resuming from " + ckpt("r", 2).string()), std::string::npos)
        << r.output;
    expect_identical("straight", "r", 6);
    // `latest` deleted: --auto-resume takes the newest checkpoint, step 4's.
    fs::remove(dir_ / "l" / "ckpt" / "latest");
    const auto l = run_command(cmd("l", 2, a + " --set train.steps=6 --auto-resume"));
    ASSERT_EQ(l.exit_code, 0) << l.output;
    EXPECT_NE(l.output.find("resuming from " + ckpt("l", 4).string()), std::string::npos)
        << l.output;
    EXPECT_EQ(checkpoint_tensors(ckpt("straight", 6)), checkpoint_tensors(ckpt("l", 6)));
}
