#pragma once
// The expert-load record of mixture-of-experts runs: per MoE block, the
// choices routed to each expert, their max/mean imbalance and the choices
// dropped over capacity, summed over the data-parallel ranks since the last
// record (metrics.jsonl's "moe" field and the apiary_moe_* gauges).

#include <nlohmann/json.hpp>
#include <vector>

#include "obs/metrics.h"
#include "parallel/engine.h"

namespace apiary::train {

// Collective: every rank calls it at the same step. Resets the model's
// counts. Returns the JSON array (null for a dense model) and fills `load`.
nlohmann::json moe_load_record(parallel::Engine& engine, std::vector<obs::MoeLoad>* load);

}  // namespace apiary::train
