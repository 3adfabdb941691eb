#pragma once
// The NCCL backend (built when cmake/cuda.cmake finds NCCL): the
// ProcessGroup contract over device memory, for tensor, pipeline and data
// parallelism and ZeRO on GPUs.
//
//  * Buffers are device memory of the GPU current when the group was made;
//    each call is queued on the group's stream and returns a Work that
//    completes when the stream passes it (a CUDA event).
//  * The unique id travels over the host group `boot` (exchange_nccl_id);
//    split() splits both (ncclCommSplit and boot->split), so a subgroup has
//    its host twin for the checks below.
//  * Checks as on MPI: with verify, each call's fingerprint chain is compared
//    across ranks over the host group before the call is queued (a mismatch
//    is a CommError naming the ranks and both calls, not a hang); the
//    watchdog is in wait(): past timeout_s the communicator is aborted
//    (ncclCommAbort) and CommError names the call, the group and the time.
//    An asynchronous NCCL error (a peer died, a network failure) is reported
//    the same way by test() and wait().
//  * send/recv between two ranks match in issue order (NCCL has no tags; the
//    tag is part of the fingerprint only).

#include <memory>

#include "comm/process_group.h"

namespace apiary::comm {

struct NcclOptions {
    double timeout_s = 300.0;
    bool verify = false;
};

// Whether this binary has the NCCL backend.
bool nccl_built();

// Collective over `boot`: a group of the same ranks over NCCL on `stream`
// (a cudaStream_t of the current GPU). Throws CommError (DeviceError on a
// build without NCCL) naming what failed.
std::shared_ptr<ProcessGroup> make_nccl_group(std::shared_ptr<ProcessGroup> boot, void* stream,
                                              const NcclOptions& options = {});

}  // namespace apiary::comm
