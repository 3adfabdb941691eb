#pragma once
// One rank's device: which GPU, its stream (inside its Ops), its memory.
// A rank opens one context at start-up, before any run directory is
// written, allocates its buffers from arena(), seals it, then runs steps.

#include <memory>

#include "device/buffer.h"
#include "device/device.h"
#include "device/ops.h"

namespace apiary::device {

// The GPU of a rank: local ranks 0..count-1 take GPUs 0..count-1, one each.
// Throws DeviceError when there are more local ranks than GPUs (sharing a
// GPU between ranks is never what a user meant).
int gpu_for_rank(int local_rank, int count);
// This process's rank on its node: OMPI_COMM_WORLD_LOCAL_RANK,
// MPI_LOCALRANKID, SLURM_LOCALID, else 0.
int local_rank_from_env();

class DeviceContext {
  public:
    // cpu: host memory and the CPU kernels. cuda: require_device's checks,
    // then GPU gpu_for_rank(local_rank, count), a stream of its own and a
    // cuBLASLt handle. `key` names the config key in messages.
    static std::unique_ptr<DeviceContext> open(DeviceKind kind, int local_rank,
                                               const std::string& key = "train.device");
    // A context over any allocator and ops (tests).
    DeviceContext(DeviceKind kind, int index, std::unique_ptr<RawAllocator> raw,
                  std::unique_ptr<Ops> ops);
    ~DeviceContext();

    DeviceKind kind() const { return kind_; }
    int index() const { return index_; }
    DeviceArena& arena() { return *arena_; }
    Ops& ops() { return *ops_; }
    std::string describe() const { return arena_->raw().describe(); }

  private:
    DeviceKind kind_;
    int index_;
    std::unique_ptr<DeviceArena> arena_;
    std::unique_ptr<Ops> ops_;  // destroyed first: its scratch lives in arena_
};

// CudaOps on GPU `device` with a new stream; its small scratch comes from
// `arena`. Throws DeviceError on a build without CUDA.
std::unique_ptr<Ops> cuda_ops(DeviceArena& arena, int device);

}  // namespace apiary::device
