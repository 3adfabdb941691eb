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
    // The match check (docs/distributed.md): every rank hashes the
    // fingerprints of all its calls in order; the hashes are compared across
    // ranks before each of a group's first verify_first calls and then before
    // every verify_every-th, so a mismatch anywhere is found at the latest
    // verify_every - 1 calls later.
    bool verify = true;
    int verify_first = 256;
    int verify_every = 64;
};

// Adds comm.backend, comm.timeout_s, comm.bucket_mb, comm.hierarchical,
// comm.nodes_hint, comm.grad_dtype, comm.verify, comm.verify_first and
// comm.verify_every.
void add_keys(core::Schema& schema);
CommOptions options_from(const core::Config& config);

}  // namespace apiary::comm
