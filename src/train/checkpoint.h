#pragma once
// The single-file checkpoint: <run>/ckpt/step_<N>/model.safetensors (weights
// by name), optimizer.safetensors (AdamW m and v) and meta.json; then
// <run>/ckpt/latest names the newest complete one. Each file is written to a
// temporary name, fsynced and renamed, and `latest` moves last, so a crash
// mid-save leaves the previous checkpoint current.

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

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
core::ModelSpec spec_from_json(const nlohmann::json& j, const std::string& where);

// Optimizer state over the whole flat buffer (gathered from every rank's
// shard under ZeRO), so any number of ranks can resume from it.
struct OptimizerState {
    const float* m = nullptr;  // flat size, or null: no optimizer file
    const float* v = nullptr;
    int64_t step_count = 0;
};

// Returns the checkpoint directory written.
// params: the whole flat parameter buffer, if not the model's own (ZeRO-3).
std::string save_checkpoint(const std::string& run_dir, int64_t step, model::Transformer& model,
                            const OptimizerState& optimizer, const nlohmann::json& extra_meta,
                            const float* params = nullptr);
// Reads m and v (flat size each, in the model's layout) and the step count.
int64_t load_optimizer_state(const CheckpointRef& ckpt, const model::Transformer& model, float* m,
                             float* v);

// The newest complete checkpoint of a run; throws IoError naming what is
// missing or foreign.
CheckpointRef latest_checkpoint(const std::string& run_dir);
// Loads weights after checking architecture and every tensor's shape.
// dst: a whole flat buffer to fill instead of the model's own (ZeRO-3).
void load_weights(const CheckpointRef& ckpt, model::Transformer& model, float* dst = nullptr);

}  // namespace apiary::train
