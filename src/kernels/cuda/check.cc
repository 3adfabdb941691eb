#include "kernels/cuda/check.h"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include "core/error.h"

namespace apiary::kernels::cuda::detail {

void cuda_failed(int code, const char* expr, const char* file, int line) {
    const auto e = static_cast<cudaError_t>(code);
    throw DeviceError(fmt::format("CUDA error {} ({}: {}) in {} at {}:{}", code,
                                  cudaGetErrorName(e), cudaGetErrorString(e), expr, file, line));
}

void cublas_failed(int code, const char* expr, const char* file, int line) {
    throw DeviceError(fmt::format("cuBLASLt error {} ({}) in {} at {}:{}", code,
                                  cublasLtGetStatusString(static_cast<cublasStatus_t>(code)), expr,
                                  file, line));
}

void unsupported(const char* what) { throw DeviceError(fmt::format("CUDA kernels: {}", what)); }

void check_launch(const char* kernel, const char* file, int line) {
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) {
        throw DeviceError(fmt::format("CUDA kernel {} failed to launch: {} ({}) at {}:{}", kernel,
                                      cudaGetErrorName(e), cudaGetErrorString(e), file, line));
    }
}

}  // namespace apiary::kernels::cuda::detail
