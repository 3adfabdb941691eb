#pragma once
// How a model's blocks are split over pipeline stages (parallel.stage_layers):
// shared by the trainer (parallel/), which builds its stages from it, and the
// planner (plan/), which costs the same stages.

#include <string>
#include <vector>

#include "core/model_spec.h"

namespace apiary::core {

// Splits n_layer blocks into `parts` contiguous ranges minimising the most
// expensive (training FLOPs per token: a block's matmuls and attention, plus
// the LM head's 6 V C on the last part); returns the count per part.
std::vector<int> balanced_stage_layers(const ModelSpec& spec, int parts, int seq_len);

// parallel.stage_layers as written ("5,4,3"): one block count >= 1 per
// (virtual) stage, `parts` of them summing to spec.n_layer. Throws
// ConfigError naming the key, the value and what would work.
std::vector<int> parse_stage_layers(const std::string& text, const ModelSpec& spec, int parts,
                                    bool virtual_stages);

}  // namespace apiary::core
