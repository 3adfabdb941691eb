#pragma once
// comm.* config keys and the options they resolve to.

#include <string>

#include "core/config.h"

namespace apiary::comm {

struct CommOptions {
    std::string backend = "mpi";  // "mpi" or "thread" (in-process, tests)
    double timeout_s = 300.0;     // a collective waiting longer than this aborts the job
    double bucket_mb = 25.0;      // DDP gradient bucket size
    bool hierarchical = false;    // node-local / inter-node all-reduce instead of flat
    int nodes_hint = 0;           // >0: pretend the world is this many equal nodes
    bool verify = true;           // cross-rank fingerprint match before every collective
};

// Adds comm.backend, comm.timeout_s, comm.bucket_mb, comm.hierarchical,
// comm.nodes_hint and comm.verify.
void add_keys(core::Schema& schema);
CommOptions options_from(const core::Config& config);

}  // namespace apiary::comm
