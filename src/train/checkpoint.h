#pragma once
// The single-file checkpoint: <run>/ckpt/step_<N>/model.safetensors (weights
// by name), optimizer.safetensors (AdamW m and v) and meta.json, which
// records the size and xxh64 of every other file; then <run>/ckpt/latest
// names the newest complete one. Each file is written to a temporary name,
// fsynced and renamed, meta.json after the files it describes and `latest`
// last, so a crash mid-save leaves the previous checkpoint current; a
// step_N folder without meta.json is a partial save, removed at the next.

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/model_spec.h"
#include "model/model.h"
#include "optim/adamw.h"

namespace apiary::train {

constexpr const char* kCheckpointFormat = "apiary.checkpoint";
constexpr int kCheckpointVersion = 1;

struct CheckpointRef {
    std::string dir;
    nlohmann::json meta;
    int64_t step = 0;
};

nlohmann::json spec_to_json(const core::ModelSpec& spec);
// Every field type- and range-checked; throws IoError naming `where`.
core::ModelSpec spec_from_json(const nlohmann::json& j, const std::string& where);
// j[key] as an integer in [lo, hi]; throws IoError naming `where` and the key.
int64_t meta_int(const nlohmann::json& j, const std::string& key, int64_t lo, int64_t hi,
                 const std::string& where);

// Optimizer state over the whole flat buffer (gathered from every rank's
// shard under ZeRO), so any number of ranks can resume from it.
struct OptimizerState {
    const float* m = nullptr;  // flat size, or null: no optimizer file
    const float* v = nullptr;
    int64_t step_count = 0;
};

// Writes step `step` and moves `latest` to it, after removing partial
// saves; then keeps only the newest `keep` checkpoints (0: all). Returns the
// checkpoint directory written.
// params: the whole flat parameter buffer, if not the model's own (ZeRO-3).
std::string save_checkpoint(const std::string& run_dir, int64_t step, model::Transformer& model,
                            const OptimizerState& optimizer, const nlohmann::json& extra_meta,
                            const float* params = nullptr, int64_t keep = 0);
// Reads m and v (flat size each, in the model's layout) and the step count.
int64_t load_optimizer_state(const CheckpointRef& ckpt, const model::Transformer& model, float* m,
                             float* v);

// A checkpoint directory, checked: meta.json well-formed, and every file it
// records present with its size and xxh64. Throws IoError naming the file.
CheckpointRef open_checkpoint(const std::string& dir);

// The checkpoint `latest` names, checked as open_checkpoint checks it. If it
// is damaged, the error names the newest intact earlier one (if any) and
// how to use it; with previous_good that one is returned instead, and
// `skipped` (if given) gets what was wrong with the newer ones.
CheckpointRef latest_checkpoint(const std::string& run_dir, bool previous_good = false,
                                std::vector<std::string>* skipped = nullptr);

// Complete step folders (those with a meta.json), newest first.
std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& run_dir);

// Loads weights after checking architecture and every tensor's shape; a
// tensor the model does not have is refused too.
// dst: a whole flat buffer to fill instead of the model's own (ZeRO-3).
void load_weights(const CheckpointRef& ckpt, model::Transformer& model, float* dst = nullptr);

}  // namespace apiary::train
