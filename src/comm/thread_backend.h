#pragma once
// Ranks as threads in one process (as gloo and nccl-tests do in their tests):
// the full ProcessGroup contract without MPI, so collectives, meshes and DDP
// helpers can be unit-tested in milliseconds.
//
// Collectives run eagerly: a call blocks until every rank of the group has
// made it, then returns a completed Work. recv is the exception: it completes
// on wait() or test(), so exchange patterns (both send, then both recv) work.
// A call that waits longer than `timeout_s` breaks the group: every rank's
// pending and later calls throw CommError with the diagnosis (who is behind,
// or who called something else).

#include <functional>
#include <memory>
#include <vector>

#include "comm/process_group.h"

namespace apiary::comm {

struct ThreadWorldOptions {
    double timeout_s = 30.0;
    // Compare fingerprints at every collective (always cheap here).
    bool verify = true;
};

// The world group of each of `size` ranks; thread i must use element i.
std::vector<std::shared_ptr<ProcessGroup>> make_thread_world(int size,
                                                             ThreadWorldOptions options = {});

// Runs fn(world) on `size` threads, one per rank, and joins them. If any rank
// threw, rethrows the exception of the lowest such rank.
void run_threads(int size, const std::function<void(ProcessGroup& world)>& fn,
                 ThreadWorldOptions options = {});

}  // namespace apiary::comm
