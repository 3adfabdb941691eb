#pragma once
// The seam between the device layer and its CUDA module. The CUDA backend
// (kernels/cuda/, cuda_ops.cc, with cuBLASLt and the CUDA runtime) is built
// as a shared module, libapiary_cuda.so, that the device layer loads with
// dlopen on first use: loading cuBLASLt costs about 0.6 s and 200 MB of
// memory, which no command that runs on the CPU should pay. This header is
// the module's one entry point; the module and apiary are built together,
// so the table may carry C++ types.

#include <memory>

#include "device/buffer.h"
#include "device/device.h"
#include "device/ops.h"

namespace apiary::device {

constexpr int kCudaBackendAbi = 1;

struct CudaBackend {
    int abi = kCudaBackendAbi;
    CudaProbe (*probe)() = nullptr;
    std::unique_ptr<RawAllocator> (*allocator)(int device) = nullptr;
    std::unique_ptr<Ops> (*ops)(DeviceArena& arena, int device) = nullptr;
};

// The loaded module's table, or nullptr with *why saying what failed (the
// path tried and dlerror). Loaded once per process. Search order: the file
// named by APIARY_CUDA_MODULE; libapiary_cuda.so beside the executable; the
// build folder it was built in; the dynamic loader's search path.
const CudaBackend* cuda_backend(std::string* why);

}  // namespace apiary::device

// The module exports this (C linkage, so dlsym finds it by name).
extern "C" const apiary::device::CudaBackend* apiary_cuda_backend_v1();
