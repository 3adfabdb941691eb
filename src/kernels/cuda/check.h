#pragma once
// Turning a failed CUDA, cuBLAS or NCCL call into apiary::DeviceError, from
// code that nvcc compiles (which therefore includes no fmt).

namespace apiary::kernels::cuda::detail {

// Throws DeviceError: "<library> error <code> (<name>) in <expr> at file:line".
[[noreturn]] void cuda_failed(int code, const char* expr, const char* file, int line);
[[noreturn]] void cublas_failed(int code, const char* expr, const char* file, int line);
// Throws DeviceError: a shape or argument the CUDA kernel does not take.
[[noreturn]] void unsupported(const char* what);
// After a kernel launch: throws if the launch failed.
void check_launch(const char* kernel, const char* file, int line);

}  // namespace apiary::kernels::cuda::detail

#define APIARY_CUDA_CALL(expr)                                                                    \
    do {                                                                                          \
        const int apiary_err_ = static_cast<int>(expr);                                           \
        if (apiary_err_ != 0)                                                                     \
            ::apiary::kernels::cuda::detail::cuda_failed(apiary_err_, #expr, __FILE__, __LINE__); \
    } while (0)
#define APIARY_CUBLAS_CALL(expr)                                                         \
    do {                                                                                 \
        const int apiary_err_ = static_cast<int>(expr);                                  \
        if (apiary_err_ != 0)                                                            \
            ::apiary::kernels::cuda::detail::cublas_failed(apiary_err_, #expr, __FILE__, \
                                                           __LINE__);                    \
    } while (0)
#define APIARY_CUDA_LAUNCHED(name) \
    ::apiary::kernels::cuda::detail::check_launch(name, __FILE__, __LINE__)
