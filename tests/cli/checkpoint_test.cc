// Checkpoints at scale, through the real engine under mpirun: bit-exact
// resume after kill -9 (one rank, ZeRO-3 on four, tp2 x pp2 on four), a
// checkpoint of one layout continued under others, the memory a save needs,
// async saves writing what sync saves write, incremental saves writing only
// what changed, a supervised job coming back after a rank dies, and every
// kind of damage detected with the previous checkpoint kept.

#include <gtest/gtest.h>
#include <sys/mount.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "checkpoint_fixture.h"

using namespace apiary::testing;
namespace fs = std::filesystem;
using nlohmann::json;

TEST_F(Checkpoints, KilledAndResumedRunsEqualUninterruptedOnesBitForBit) {
    const std::vector<std::tuple<std::string, int, std::string>> layouts = {
        {"one", 1, args(1, "")},
        {"zero3", 4, args(4, "--set parallel.zero_stage=3")},
        {"tp2pp2", 4, args(1, "--set parallel.tp=2 --set parallel.pp=2")},
    };
    for (const auto& [name, ranks, a] : layouts) {
        SCOPED_TRACE(name);
        run(name + "_straight", ranks, a + " --set train.steps=40");
        killed_and_resumed(name + "_killed", ranks, a);
        expect_identical(name + "_straight", name + "_killed", 40);
    }
}

TEST_F(Checkpoints, OneLayoutsCheckpointContinuesUnderOthers) {
    // Saved at step 10 by four data-parallel ranks (ZeRO-1), continued by
    // two, by tp2 x dp2 and by pp2 x dp2: each ends where the run that
    // never changed layout ends.
    run("dp4", 4,
        args(4,
             "--set parallel.zero_stage=1 --set train.steps=20 "
             "--set train.ckpt_every=10"));
    run("init", 1,
        args(1,
             "--set train.steps=1 --set train.lr=0 --set train.min_lr=0 "
             "--set train.warmup_steps=0"));
    const std::vector<std::pair<std::string, std::string>> targets = {
        {"dp2", ""}, {"tp2dp2", "--set parallel.tp=2"}, {"pp2dp2", "--set parallel.pp=2"}};
    for (const auto& [name, extra] : targets) {
        SCOPED_TRACE(name);
        fs::copy(dir_ / "dp4", dir_ / name, fs::copy_options::recursive);
        fs::remove_all(ckpt(name, 20));
        std::ofstream(dir_ / name / "ckpt" / "latest", std::ios::trunc) << "step_00000010";
        const int ranks = extra.empty() ? 2 : 4;
        const auto r = run_command(std::string(APIARY_MPIRUN) + " -n " + std::to_string(ranks) +
                                   " " + apiary_bin() + " train --resume " +
                                   (dir_ / name).string() + " --set train.batch_size=2 " + extra);
        ASSERT_EQ(r.exit_code, 0) << r.output;
        runs_->expect_series_near("dp4", name, "loss", 20, 1e-5);
        EXPECT_LT(runs_->update_difference("dp4", name, "init", 20), 1e-4);
        EXPECT_EQ(run_command(apiary_bin() + " ckpt verify " + (dir_ / name).string()).exit_code,
                  0);
    }
}

TEST_F(Checkpoints, AsyncSavesWriteWhatSyncSavesWriteAndBoundTheirMemory) {
    const std::string a = args(4,
                               "--set parallel.zero_stage=3 --set train.steps=6 "
                               "--set train.ckpt_every=2");
    run("sync", 4, a);
    run("async", 4, a + " --set train.ckpt_async=true");
    run("none", 4, args(4, "--set parallel.zero_stage=3 --set train.steps=6"));
    for (int step : {2, 4, 6}) {
        for (int r = 0; r < 4; ++r) {
            const std::string f = fmt::format("rank_{:05d}.safetensors", r);
            EXPECT_EQ(read_lines((ckpt("sync", step) / f).string()),
                      read_lines((ckpt("async", step) / f).string()))
                << f << " of step " << step;
        }
        EXPECT_EQ(checkpoint_manifest(ckpt("sync", step))["chunks"],
                  checkpoint_manifest(ckpt("async", step))["chunks"]);
    }
    // Memory: a synchronous save writes from the shards in place; an async
    // one adds one copy of this rank's shard (params, m, v: 12 bytes per
    // element of its pieces), never the whole model.
    auto peak = [&](const std::string& name) {
        for (const auto& j : runs_->metrics(name)) {
            if (j.contains("memory_peak_bytes_per_rank")) {
                int64_t total = 0;
                for (const auto& [k, v] : j["memory_peak_bytes_per_rank"].items()) {
                    total += v.get<int64_t>();
                }
                return total;
            }
        }
        return int64_t(-1);
    };
    const auto manifest = checkpoint_manifest(ckpt("sync", 6));
    int64_t shard = 0;  // rank 0's floats
    for (const auto& c : manifest["chunks"]) {
        if (c["file"] == "rank_00000.safetensors") shard += c["count"].get<int64_t>();
    }
    EXPECT_EQ(peak("sync"), peak("none"));
    EXPECT_GT(peak("async"), peak("none"));
    EXPECT_LE(peak("async") - peak("none"), shard * 4 + 4096);
}

TEST_F(Checkpoints, IncrementalSavesWriteOnlyWhatChanged) {
    // Fine-tuning with the embedding and the first two blocks frozen.
    const std::string frozen = "model.embed_tokens.,model.layers.0.,model.layers.1.";
    run("inc", 1,
        args(1,
             "--set train.steps=6 --set train.ckpt_every=3 "
             "--set train.ckpt_incremental=true --set train.freeze=" +
                 frozen));
    int64_t frozen_bytes = 0, trained_bytes = 0;
    const json manifest = checkpoint_manifest(ckpt("inc", 6));
    for (const auto& c : manifest["chunks"]) {
        const std::string t = c["tensor"].get<std::string>();
        const bool is_frozen = t.rfind("model.embed_tokens.", 0) == 0 ||
                               t.rfind("model.layers.0.", 0) == 0 ||
                               t.rfind("model.layers.1.", 0) == 0;
        (is_frozen ? frozen_bytes : trained_bytes) += 4 * c["count"].get<int64_t>();
    }
    std::vector<json> saves;
    for (const auto& j : runs_->metrics("inc")) {
        if (j.value("event", "") == "checkpoint") saves.push_back(j);
    }
    ASSERT_EQ(saves.size(), 2u);
    // The second save rewrites the trained tensors only.
    EXPECT_EQ(saves[1]["bytes_written"].get<int64_t>(), trained_bytes);
    EXPECT_EQ(saves[1]["bytes_reused"].get<int64_t>(), frozen_bytes);
    // The frozen parameters did not move; the checkpoint verifies and resumes.
    const auto p3 = checkpoint_tensors(ckpt("inc", 3)), p6 = checkpoint_tensors(ckpt("inc", 6));
    EXPECT_EQ(p3.at("model.layers.0.mlp.up_proj.weight"),
              p6.at("model.layers.0.mlp.up_proj.weight"));
    EXPECT_NE(p3.at("model.layers.3.mlp.up_proj.weight"),
              p6.at("model.layers.3.mlp.up_proj.weight"));
    EXPECT_EQ(run_command(apiary_bin() + " ckpt verify " + (dir_ / "inc").string()).exit_code, 0);
    const auto r = run_command(apiary_bin() + " train --resume " + (dir_ / "inc").string() +
                               " --set train.steps=8");
    EXPECT_EQ(r.exit_code, 0) << r.output;
}

TEST_F(Checkpoints, ASupervisedJobComesBackAfterARankIsKilled) {
    const std::string a = args(2, "--set train.steps=300 --set train.ckpt_every=5");
    run("straight", 2, a);
    {
        Background bg(apiary_bin() + " launch -n 2 --max-restarts 1 -- train --set run.dir=" +
                          (dir_ / "job").string() + " " + a,
                      (dir_ / "job.out").string());
        ASSERT_TRUE(wait_until([&] { return latest("job") >= "step_00000015"; }, 180))
            << bg.output();
        // One rank dies.
        // (The bracket keeps the pattern from matching the shell that runs pkill.)
        run_command("pkill -KILL -n -f '[a]piary train --auto-resume --set run.dir=" +
                    (dir_ / "job").string() + " '");
        EXPECT_EQ(bg.wait(), 0) << bg.output();
        EXPECT_NE(bg.output().find("restart 1 of 1"), std::string::npos) << bg.output();
    }
    expect_identical("straight", "job", 300);
    bool logged = false;
    for (const auto& j : runs_->metrics("job")) logged |= j.value("event", "") == "restart";
    EXPECT_TRUE(logged);
}

TEST_F(Checkpoints, ElasticRestartsOnFewerRanksKeepTheGlobalBatch) {
    // train.elastic: four ranks to step 5, two to step 10, one to step 15;
    // each rescale keeps 8 sequences a step, so the run is the one that
    // stayed on four ranks (the second rescale starts from the first's).
    // min_lr = lr: the schedule does not depend on train.steps, which grows.
    const std::string a = args(
        4, "--set train.elastic=true --set train.ckpt_every=5 --set train.min_lr=1e-3");
    run("straight", 4, a + " --set train.steps=15");
    run("elastic", 4, a + " --set train.steps=5");
    for (const auto& [ranks, steps] : {std::pair{2, 10}, std::pair{1, 15}}) {
        const std::string launcher =
            ranks > 1 ? std::string(APIARY_MPIRUN) + " -n " + std::to_string(ranks) + " " : "";
        const auto r = run_command(launcher + apiary_bin() + " train --resume " +
                                   (dir_ / "elastic").string() +
                                   " --set train.steps=" + std::to_string(steps));
        ASSERT_EQ(r.exit_code, 0) << r.output;
    }
    runs_->expect_series_near("straight", "elastic", "loss", 15, 1e-5);
    EXPECT_EQ(runs_->series("straight", "tokens"), runs_->series("elastic", "tokens"));
}

TEST_F(Checkpoints, AutoResumeStartsAgainARunKilledBeforeItsFirstSave) {
    const std::string a = args(1, "--set train.steps=400 --set train.ckpt_every=1000");
    {
        Background bg(cmd("early", 1, a), (dir_ / "early.out").string());
        ASSERT_TRUE(wait_until([&] { return runs_->series("early", "loss").size() >= 2; }, 120))
            << bg.output();
        bg.signal(SIGKILL);
        bg.wait();
    }
    ASSERT_FALSE(fs::exists(dir_ / "early" / "ckpt" / "latest"));
    const std::string again = " --set train.steps=4 --set train.ckpt_every=2";
    const auto r = run_command(apiary_bin() + " train --auto-resume --set run.dir=" +
                               (dir_ / "early").string() + " " + a + again);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(latest("early"), "step_00000004");
    EXPECT_EQ(runs_->series("early", "loss").size(), 4u);  // the killed run's lines are gone
    // And now it resumes instead.
    const auto more = run_command(apiary_bin() + " train --auto-resume --set run.dir=" +
                                  (dir_ / "early").string() + " " + a +
                                  " --set train.steps=6 --set train.ckpt_every=2");
    ASSERT_EQ(more.exit_code, 0) << more.output;
    EXPECT_EQ(latest("early"), "step_00000006");
}

TEST_F(Checkpoints, DamageIsDetectedAndTheGoodCheckpointStays) {
    const std::string a = args(2, "--set train.steps=4 --set train.ckpt_every=2");
    run("r", 2, a);
    const fs::path c4 = ckpt("r", 4);
    auto resume = [&] {
        return run_command(std::string(APIARY_MPIRUN) + " -n 2 " + apiary_bin() +
                           " train --resume " + (dir_ / "r").string() + " --set train.steps=6");
    };
    auto verify = [&] { return run_command(apiary_bin() + " ckpt verify " + c4.string()); };
    auto expect_error = [](const CommandResult& r, const std::string& what) {
        EXPECT_NE(r.exit_code, 0) << r.output;
        EXPECT_NE(r.output.find(what), std::string::npos) << r.output;
    };
    const json good = checkpoint_manifest(c4);
    auto write = [&](const json& m) { std::ofstream(c4 / "manifest.json") << m.dump(); };
    // A missing shard file: named, and the earlier checkpoint offered.
    fs::rename(c4 / "rank_00001.safetensors", dir_ / "saved");
    expect_error(resume(), "rank_00001.safetensors: missing");
    expect_error(resume(), "step_00000002 (step 2) is intact");
    fs::rename(dir_ / "saved", c4 / "rank_00001.safetensors");
    // A truncated one.
    fs::copy_file(c4 / "rank_00000.safetensors", dir_ / "saved");
    fs::resize_file(c4 / "rank_00000.safetensors", 1000);
    expect_error(resume(), "rank_00000.safetensors: 1000 bytes, but");
    fs::copy_file(dir_ / "saved", c4 / "rank_00000.safetensors",
                  fs::copy_options::overwrite_existing);
    // A manifest that lies: a wrong shape, a slice stored twice, a slice
    // stored nowhere, a path out of the directory.
    json m = good;
    m["chunks"][0]["placement"]["global_shape"][0] = 7;
    write(m);
    expect_error(resume(), "placement: dimension 0 is 257 locally but 7 globally");
    m = good;
    m["chunks"].push_back(m["chunks"][0]);
    write(m);
    expect_error(verify(), "are stored twice");
    m = good;
    m["chunks"].erase(m["chunks"].begin());
    write(m);
    expect_error(verify(), "are stored nowhere");
    expect_error(resume(), "in no stored chunk");
    m = good;
    m["files"]["../../escape"] = m["files"]["rank_00000.safetensors"];
    write(m);
    expect_error(verify(), "would leave the checkpoint directory");
    write(good);
    EXPECT_EQ(verify().exit_code, 0);
    // `latest` naming a checkpoint that is not there.
    std::ofstream(dir_ / "r" / "ckpt" / "latest", std::ios::trunc) << "step_00000099";
    expect_error(resume(), "step_00000099/manifest.json: missing");
}

TEST_F(Checkpoints, AFullDiskFailsTheSaveAndKeepsThePreviousOne) {
    if (::geteuid() != 0) GTEST_SKIP() << "mounting a small tmpfs needs root";
    // Room for the run and one checkpoint (about 6 MB), not for two.
    const fs::path mnt = dir_ / "mnt";
    fs::create_directories(mnt);
    ASSERT_EQ(::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=15m"), 0) << std::strerror(errno);
    mounted_ = true;
    const auto r = run_command(apiary_bin() + " train --set run.dir=" + (mnt / "run").string() +
                               " " + args(1, "--set train.steps=6 --set train.ckpt_every=2"));
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("the checkpoint of step 4 failed"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("the final checkpoint (step 6) failed"), std::string::npos) << r.output;
    // Step 2's checkpoint is intact, named latest, and nothing partial is left.
    std::ifstream in(mnt / "run" / "ckpt" / "latest");
    std::string name;
    std::getline(in, name);
    EXPECT_EQ(name, "step_00000002");
    EXPECT_FALSE(fs::exists(mnt / "run" / "ckpt" / "step_00000004"));
    EXPECT_EQ(run_command(apiary_bin() + " ckpt verify " + (mnt / "run").string()).exit_code, 0);
}

TEST_F(Checkpoints, RollbackSkipsTheBadBatchAndAResumeSkipsItToo) {
    // Batch 7's gradients are made non-finite: the run goes back to step 4's
    // checkpoint and trains on, never on batch 7.
    const std::string a = args(1,
                               "--set train.ckpt_every=4 --set train.rollback=true "
                               "--set debug.inject_overflow_steps=7 ");
    run("rolled", 1, a + "--set train.steps=12");
    json rollback;
    for (const auto& j : runs_->metrics("rolled")) {
        if (j.value("event", "") == "rollback") rollback = j;
    }
    ASSERT_FALSE(rollback.is_null());
    EXPECT_EQ(rollback["at_step"], 7);
    EXPECT_EQ(rollback["step"], 4);
    EXPECT_EQ(rollback["skipped_batch"], 7);
    EXPECT_EQ(runs_->series("rolled", "loss").size(), 12u);  // each step logged once
    EXPECT_EQ(checkpoint_manifest(ckpt("rolled", 12))["skipped_batches"], json::array({7}));
    // A checkpoint written after the rollback carries the skip: resumed from
    // step 8, the run continues past batch 7 exactly as it did.
    EXPECT_EQ(checkpoint_manifest(ckpt("rolled", 8))["skipped_batches"], json::array({7}));
    fs::copy(dir_ / "rolled", dir_ / "resumed", fs::copy_options::recursive);
    fs::remove_all(ckpt("resumed", 12));
    std::ofstream(dir_ / "resumed" / "ckpt" / "latest", std::ios::trunc) << "step_00000008";
    const auto r = run_command(apiary_bin() + " train --resume " + (dir_ / "resumed").string());
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(checkpoint_tensors(ckpt("rolled", 12)), checkpoint_tensors(ckpt("resumed", 12)));
    EXPECT_EQ(runs_->series("rolled", "loss"), runs_->series("resumed", "loss"));
    // Without rollback the same batch stops the run, as before.
    const auto plain = run_command(cmd("plain", 1,
                                       args(1,
                                            "--set train.steps=12 "
                                            "--set debug.inject_overflow_steps=7")));
    EXPECT_NE(plain.exit_code, 0);
    EXPECT_NE(plain.output.find("non-finite gradients at step 7"), std::string::npos)
        << plain.output;
}

TEST_F(Checkpoints, TooManySpikesStopTheRun) {
    // A z-score limit no training curve stays under: every step after the
    // window fills is a "spike", and the rollbacks run out.
    const auto r = run_command(cmd("spiky", 1,
                                   args(1,
                                        "--set train.steps=40 --set train.ckpt_every=2 "
                                        "--set train.rollback=true --set train.spike_window=4 "
                                        "--set train.spike_zscore=1e-6 --set train.lr=1e-2 "
                                        "--set train.max_rollbacks=2")));
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.output.find("standard deviations above the mean"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("2 rollbacks already (train.max_rollbacks)"), std::string::npos)
        << r.output;
}
