// A build without the CUDA backend (APIARY_CUDA=OFF or no toolkit): the probe
// says so, and anything that would touch a GPU throws DeviceError.

#include "core/error.h"
#include "device/context.h"

namespace apiary::device {

bool cuda_built() { return false; }
CudaProbe probe_cuda() { return {}; }

namespace {
[[noreturn]] void no_cuda(const char* what) {
    throw DeviceError(
        fmt::format("{}: this apiary was built without the CUDA backend "
                    "(APIARY_CUDA=OFF, or AUTO found no CUDA toolkit)",
                    what));
}
}  // namespace

std::unique_ptr<RawAllocator> cuda_allocator(int) { no_cuda("cuda_allocator"); }
std::unique_ptr<Ops> cuda_ops(DeviceArena&, int) { no_cuda("cuda_ops"); }

}  // namespace apiary::device
