#pragma once
// Launch helpers shared by the .cu files of the CUDA backend.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/check.h"

namespace apiary::kernels::cuda::detail {

constexpr int kThreads = 256;

// Blocks for a grid-stride loop over n elements: enough to fill any GPU,
// few enough that each thread does several.
inline unsigned grid_for(int64_t n, int threads = kThreads) {
    const int64_t blocks = (n + threads - 1) / threads;
    return unsigned(std::clamp<int64_t>(blocks, 1, int64_t(1) << 16));
}

// Sum over a warp, every lane gets it.
template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every
// thread gets it. `shared` holds 32 values; safe to call repeatedly.
template <typename T>
__device__ T block_sum(T v, T* shared) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    v = warp_sum(v);
    __syncthreads();  // a previous call may still be reading shared
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    T total = 0;
    const int warps = blockDim.x / 32;
    for (int w = 0; w < warps; ++w) total += shared[w];
    return total;
}

__device__ __forceinline__ uint16_t bf16_bits(float x) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(x));
}
__device__ __forceinline__ float bf16_value(uint16_t b) {
    return __bfloat162float(__ushort_as_bfloat16(b));
}

}  // namespace apiary::kernels::cuda::detail
