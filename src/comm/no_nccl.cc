// A build without NCCL: the backend says so when asked for.

#include "comm/nccl_backend.h"
#include "core/error.h"

namespace apiary::comm {

bool nccl_built() { return false; }

std::shared_ptr<ProcessGroup> make_nccl_group(std::shared_ptr<ProcessGroup>, void*,
                                              const NcclOptions&) {
    throw DeviceError(
        "the NCCL backend is not in this build (configure with the CUDA toolkit and NCCL: "
        "APIARY_CUDA=ON, APIARY_NCCL_ROOT if NCCL is outside the toolkit)");
}

}  // namespace apiary::comm
