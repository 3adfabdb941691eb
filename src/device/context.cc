#include "device/context.h"

#include <fmt/format.h>

#include <cstdlib>
#include <string>

#include "core/allocator.h"
#include "core/error.h"

namespace apiary::device {

int gpu_for_rank(int local_rank, int count) {
    if (count <= 0) throw DeviceError("no GPU to place the rank on (0 devices visible)");
    if (local_rank < 0 || local_rank >= count) {
        throw DeviceError(fmt::format(
            "local rank {} has no GPU of its own: {} visible on this node (CUDA_VISIBLE_DEVICES); "
            "start at most {} ranks per node",
            local_rank, count, count));
    }
    return local_rank;
}

int local_rank_from_env() {
    for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"}) {
        if (const char* v = std::getenv(name); v && *v) {
            char* end = nullptr;
            const long r = std::strtol(v, &end, 10);
            if (*end != '\0' || r < 0) {
                throw DeviceError(fmt::format("{} = '{}' is not a local rank", name, v));
            }
            return int(r);
        }
    }
    return 0;
}

DeviceContext::DeviceContext(DeviceKind kind, int index, std::unique_ptr<RawAllocator> raw,
                             std::unique_ptr<Ops> ops)
    : kind_(kind),
      index_(index),
      arena_(std::make_unique<DeviceArena>(std::move(raw))),
      ops_(std::move(ops)) {}

DeviceContext::~DeviceContext() { ops_.reset(); }

std::unique_ptr<DeviceContext> DeviceContext::open(DeviceKind kind, int local_rank,
                                                   const std::string& key) {
    if (kind == DeviceKind::cpu) {
        const int64_t avail = core::available_memory_bytes();
        return std::make_unique<DeviceContext>(
            kind, 0, host_allocator(avail > 0 ? avail : INT64_MAX), cpu_ops());
    }
    const CudaProbe p = probe_cuda();
    require_device(kind, key, [&] { return p; });
    const int gpu = gpu_for_rank(local_rank, p.count);
    auto ctx = std::make_unique<DeviceContext>(kind, gpu, cuda_allocator(gpu), nullptr);
    ctx->ops_ = cuda_ops(*ctx->arena_, gpu);
    return ctx;
}

}  // namespace apiary::device
