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

nlohmann::json spec_to_json(const core::ModelSpec& spec);
core::ModelSpec spec_from_json(const nlohmann::json& j, const std::string& where);

// Returns the checkpoint directory written.
std::string save_checkpoint(const std::string& run_dir, int64_t step, model::Transformer& model,
                            optim::AdamW* optimizer, const nlohmann::json& extra_meta);

struct CheckpointRef {
    std::string dir;
    nlohmann::json meta;
    int64_t step = 0;
};
// The newest complete checkpoint of a run; throws IoError naming what is
// missing or foreign.
CheckpointRef latest_checkpoint(const std::string& run_dir);
// Loads weights after checking architecture and every tensor's shape.
void load_weights(const CheckpointRef& ckpt, model::Transformer& model);

}  // namespace apiary::train
