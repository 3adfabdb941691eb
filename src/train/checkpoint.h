#pragma once
// Checkpoints of a run: <run>/ckpt/step_<N>/ holds one safetensors file per
// rank with what that rank owns (its data-parallel piece of its tensor- and
// pipeline-parallel shard: parameters and AdamW's m and v) and
// manifest.json, which says where every slice of every global tensor is and
// records the step, the model, the layout, the data loader's and the loss
// scaler's state and every file's size and xxh64 (ckpt/sharded.h,
// docs/formats.md). Each file is written under a temporary name, fsynced
// and renamed; the manifest comes after every rank's file and <run>/ckpt/
// latest moves last, so a crash mid-save leaves the previous checkpoint
// current; a step folder without its manifest is a partial save, removed at
// the next save. Loading reads only the slices this rank's place in the
// current layout needs, whatever layout saved them (resharding).

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/model_spec.h"
#include "model/model.h"
#include "parallel/engine.h"

namespace apiary::train {

constexpr const char* kCheckpointFormat = "apiary.checkpoint";
constexpr int kCheckpointVersion = 2;

struct CheckpointRef {
    std::string dir;
    nlohmann::json meta;  // the manifest's description (or version 1's meta.json)
    int64_t step = 0;
    int version = kCheckpointVersion;
};

nlohmann::json spec_to_json(const core::ModelSpec& spec);
// Every field type- and range-checked; throws IoError naming `where`.
core::ModelSpec spec_from_json(const nlohmann::json& j, const std::string& where);
// j[key] as an integer in [lo, hi]; throws IoError naming `where` and the key.
int64_t meta_int(const nlohmann::json& j, const std::string& key, int64_t lo, int64_t hi,
                 const std::string& where);

struct SaveOptions {
    int64_t keep = 0;          // checkpoints kept (0: all)
    bool async = false;        // write in a background thread while training goes on
    bool incremental = false;  // content-addressed pieces: unchanged bytes are not rewritten
    int64_t piece_bytes = int64_t(4) << 20;
};

// What the last committed (or failed) save did, over every rank.
struct SaveStats {
    int64_t step = -1;
    std::string dir;
    double stall_s = 0;          // the training thread's time in save()
    double total_s = 0;          // from save() to the commit
    uint64_t bytes_written = 0;  // by every rank
    uint64_t bytes_reused = 0;   // incremental: pieces an earlier save stored
    std::string error;           // non-empty: the save failed; the previous one stays latest
};

// Saves checkpoints of one run. Every call is collective over the engine's
// ranks: each writes its own part (its file, or its pieces), the first
// writes the manifest (with the caller's `meta` at its top level) once all
// have, then `latest`, then applies retention. With async, save() copies
// this rank's part to a buffer of its own (the stall) and a background
// thread writes it while training goes on; poll() commits it once every
// rank's write is done. At most one save is in flight: a save() while one
// is waits for it first. A failed write is reported in SaveStats::error
// (and on stderr by the first rank); the previous checkpoint stays latest.
// Every field of a save's manifest describes the step it snapshots, taken
// in save(), however much later it commits.
class CheckpointSaver {
  public:
    CheckpointSaver(parallel::Engine& engine, std::string run_dir, SaveOptions options);
    ~CheckpointSaver();
    CheckpointSaver(const CheckpointSaver&) = delete;
    CheckpointSaver& operator=(const CheckpointSaver&) = delete;
    // Sync: returns once committed. Async: once the background write started.
    void save(int64_t step, const nlohmann::json& meta);
    // Commits a finished async save (wait: blocks until it is). Collective:
    // call on every rank at the same points (the trainer: after each step).
    // Returns true when a save was committed or failed now.
    bool poll(bool wait);
    bool in_flight() const { return pending_ != nullptr; }
    const SaveStats& last() const { return last_; }

  private:
    struct Pending;
    void commit();
    parallel::Engine& engine_;
    std::string run_dir_;
    SaveOptions options_;
    core::Tensor snapshot_;  // async: this rank's part, copied
    std::unique_ptr<Pending> pending_;
    SaveStats last_;
};

// A synchronous save (CheckpointSaver with default options); returns the
// directory written. Throws IoError if it fails.
std::string save_checkpoint(parallel::Engine& engine, const std::string& run_dir, int64_t step,
                            const nlohmann::json& meta, int64_t keep = 0);
// Every rank reads its parameters and optimizer state (and AdamW's step
// count) from the checkpoint, whatever layout wrote it.
void load_checkpoint(parallel::Engine& engine, const CheckpointRef& ckpt);
// The whole model's weights into a one-rank model (generate, export).
void load_weights(const CheckpointRef& ckpt, model::Transformer& model);

// A checkpoint directory, checked: the manifest well-formed (step, model,
// file names, placements), and every file present with its recorded size
// and xxh64. Throws IoError naming the file. (The counters are for
// resuming: a checkpoint whose counters disagree still has its weights.)
// Without digests, sizes only (each chunk's xxh64 is then checked as it is
// read).
CheckpointRef open_checkpoint(const std::string& dir, bool digests = true);

// The manifest's counters agree with each other, as a resume needs them
// to: every step either updated the weights or was skipped for fp16
// overflow (optimizer_steps == step - loss_scaler.skipped_steps), and the
// loader returned one batch per step plus each skipped batch it passed
// (loader.step == step + those skipped). Resume (Trainer::load, before
// anything changes) and verify_checkpoint (`apiary ckpt verify`, the choice
// of a checkpoint to fall back to) check it here. Throws IoError naming
// the manifest.
void check_counters(const CheckpointRef& ck);

// Everything `apiary ckpt verify` checks: open_checkpoint's checks, the
// counters, every chunk's xxh64, every slice of every tensor stored exactly
// once, with its optimizer state. Throws IoError naming what is wrong.
CheckpointRef verify_checkpoint(const std::string& dir);

// What <run>/ckpt/latest names: a step folder (which may still be damaged),
// or, with `problem` set, why it names none (missing, empty, not step_N).
struct LatestName {
    std::string dir;
    int64_t step = -1;
    std::string problem;
    bool missing = false;
};
LatestName read_latest(const std::string& run_dir);

// The newest complete checkpoint before step `below` that verifies
// (verify_checkpoint), or none; `why` (if given) gets what was wrong with
// each newer one.
std::optional<CheckpointRef> newest_intact(const std::string& run_dir, int64_t below,
                                           std::vector<std::string>* why = nullptr);

// What to tell a user whose `latest` (or its checkpoint) is damaged and
// `good` is the newest intact one: what is wrong and the command that
// continues from it.
std::string continue_from(const std::string& run_dir, const LatestName& latest,
                          const CheckpointRef& good);

// The checkpoint `latest` names, checked as open_checkpoint checks it. If it
// is damaged, or `latest` itself is (missing, empty, naming no step folder),
// the error names the newest intact checkpoint (earlier than the one
// `latest` names, if it names one) and how to continue from it; with
// previous_good the one `latest` names is verified in full (every chunk's
// xxh64) and, if damaged, that newest intact one is returned instead, and
// `skipped` (if given) gets what was wrong with `latest` and the newer ones.
CheckpointRef latest_checkpoint(const std::string& run_dir, bool previous_good = false,
                                std::vector<std::string>* skipped = nullptr);

// Complete step folders (those with a manifest), newest first.
std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& run_dir);

}  // namespace apiary::train
