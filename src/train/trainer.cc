#include "train/trainer.h"

#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

#include "ckpt/sharded.h"
#include "core/error.h"
#include "train/checkpoint.h"
#include "train/loop.h"
#include "train/options.h"
#include "train/run_dir.h"
#include "train/train_data.h"

// The entry points: a new run and a resumed one. Both check everything that
// can be checked before the run directory is touched, then hand over to the
// loop (train/loop.h).

namespace apiary::train {

namespace fs = std::filesystem;

namespace {

void barrier(comm::ProcessGroup* world) {
    if (world && world->size() > 1) world->barrier({"run_dir", 0})->wait();
}

// What every rank reads: the first rank builds whatever the cache lacks,
// then the others find it there (or, without a shared file system, build
// the same bytes themselves).
TrainData shared_train_data(const core::Config& c, comm::ProcessGroup* world) {
    const bool first = !world || world->rank() == 0;
    TrainData d;
    if (first) d = resolve_train_data(c, true);
    barrier(world);
    if (!first) d = resolve_train_data(c, false);
    return d;
}

// The run's tokenizer.json, for `apiary generate` (none when unknown).
void save_tokenizer(const std::string& run_dir, const TrainData& d) {
    if (d.tokenizer_json.empty()) return;
    ckpt::atomic_write((fs::path(run_dir) / kTokenizerFile).string(), d.tokenizer_json.data(),
                       d.tokenizer_json.size());
}

// train.elastic: a checkpoint saved by more (or fewer) data-parallel ranks
// continues with the same global batch, its micro-steps scaled. The run's
// config.toml records the scaled value (resume_training), so that the next
// rescale starts from what the run really did.
core::Config elastic_config(const core::Config& c, const CheckpointRef& ck, int world_size) {
    const TrainOptions o = TrainOptions::from_config(c);
    if (!o.elastic || !ck.meta.contains("layout")) return c;
    // parallel.layout = auto chose the micro-steps for this world with the
    // global batch pinned (plan.global_batch): nothing to scale.
    if (c.get_string("parallel.layout") == "auto") return c;
    const int64_t saved_dp = ck.meta["layout"].value("dp", int64_t(1));
    const comm::MeshShape mesh = comm::mesh_shape_from(c, world_size);
    const int64_t accum = o.grad_accum;
    if (saved_dp == mesh.dp) return c;
    if ((saved_dp * accum) % mesh.dp != 0) {
        throw ConfigError(fmt::format(
            "train.elastic: the checkpoint's global batch is {} data-parallel ranks x {} "
            "micro-steps; {} ranks cannot keep it (their count must divide {})",
            saved_dp, accum, mesh.dp, saved_dp * accum));
    }
    core::Config out = c;
    out.set(fmt::format("train.grad_accum={}", saved_dp * accum / mesh.dp));
    return out;
}

// Every rank holds the same config (checked by hash) and the layout fits
// the world; errors here come before any rank allocates.
void check_world(const core::Config& c, comm::ProcessGroup* world) {
    validate_config(c, world ? world->size() : 1);
    if (world && world->size() > 1) comm::check_config_hash(*world, c.hash());
}

}  // namespace

AutoResume auto_resume_policy(const std::string& run_dir) {
    AutoResume a;
    if (fs::exists(fs::path(run_dir) / "ckpt" / "latest") || !list_checkpoints(run_dir).empty()) {
        a.resume = true;
        a.previous_good = true;
    } else {
        a.overwrite = fs::exists(run_dir);
    }
    return a;
}

TrainSummary run_training(const core::Config& c, bool overwrite, comm::ProcessGroup* world) {
    const std::string run_dir = c.get_string("run.dir");
    check_world(c, world);
    const bool first = !world || world->rank() == 0;
    check_new_run_dir(run_dir, overwrite);
    // Another process may be training in an existing directory: refuse
    // before doing any work. A new one is locked when it is created.
    std::optional<RunDirLock> lock;
    if (first && fs::exists(run_dir)) lock.emplace(run_dir);
    // Resolves (and prepares) the data, builds loaders, model and optimizer:
    // every error surfaces here, before anything in the run directory is
    // touched.
    const TrainOptions o = TrainOptions::from_config(c);
    const double peak = Trainer::measure_peak(o);
    const TrainData data = shared_train_data(c, world);
    Trainer trainer(c, o, data, world, peak);
    trainer.init_fresh();
    barrier(world);  // every rank has validated before the first one writes
    if (first) {
        if (!lock) lock.emplace(run_dir);
        clear_run_dir(run_dir);
        const std::string text = c.to_toml();
        ckpt::atomic_write((fs::path(run_dir) / "config.toml").string(), text.data(), text.size());
        save_tokenizer(run_dir, data);
    }
    barrier(world);
    return trainer.run(false);
}

TrainSummary resume_training(const core::Config& c, comm::ProcessGroup* world, bool previous_good) {
    const std::string run_dir = c.get_string("run.dir");
    check_world(c, world);
    const bool first = !world || world->rank() == 0;
    std::optional<RunDirLock> lock;
    if (first && fs::is_directory(run_dir)) lock.emplace(run_dir);
    // The first rank chooses (verifying every checksum with previous_good)
    // and the others take its choice.
    CheckpointRef ck;
    if (first) {
        std::vector<std::string> skipped;
        ck = latest_checkpoint(run_dir, previous_good, &skipped);
        for (const auto& why : skipped) fmt::print(stderr, "apiary: warning: {}\n", why);
        if (!skipped.empty()) {
            fmt::print(stderr,
                       "apiary: resuming from {} (step {}), the newest checkpoint that "
                       "verifies\n",
                       ck.dir, ck.step);
        }
    }
    if (world && world->size() > 1) {
        const std::string chosen = comm::all_gather_strings(*world, ck.dir)[0];
        if (!first) ck = open_checkpoint(chosen, false);
    }
    const double peak = Trainer::measure_peak(TrainOptions::from_config(c));
    const TrainData data = shared_train_data(c, world);
    const core::Config adjusted = elastic_config(c, ck, world ? world->size() : 1);
    Trainer trainer(adjusted, TrainOptions::from_config(adjusted), data, world, peak);
    if (const char* restart = std::getenv("APIARY_RESTART"))
        trainer.set_restart(std::atoi(restart));
    try {
        trainer.load(ck);
    } catch (const IoError& e) {
        // A chunk whose checksum fails on load: name the way out.
        if (const auto good = newest_intact(run_dir, ck.step)) {
            throw IoError(
                fmt::format("{}\nthe checkpoint is damaged; {} (step {}) is intact: "
                            "continue from it with `apiary train --resume {} "
                            "--resume-from-previous-good`",
                            e.what(), good->dir, good->step, run_dir));
        }
        throw;
    }
    barrier(world);
    if (first) {
        // The records of steps after the checkpoint are written again.
        truncate_metrics(run_dir, ck.step);
        // Record the config the run continues with (e.g. a raised
        // train.steps, or micro-steps rescaled by train.elastic).
        const std::string text = adjusted.to_toml();
        ckpt::atomic_write((fs::path(run_dir) / "config.toml").string(), text.data(), text.size());
        if (!fs::exists(fs::path(run_dir) / kTokenizerFile)) save_tokenizer(run_dir, data);
    }
    return trainer.run(true);
}

}  // namespace apiary::train
