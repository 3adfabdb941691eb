#pragma once
#include "core/config.h"

namespace apiary::train {
// Adds train.*, data.*, run.* and comm.* keys (the shared model/parallel/batch keys
// come from core::add_shared_keys).
void add_keys(core::Schema& schema);
}  // namespace apiary::train
