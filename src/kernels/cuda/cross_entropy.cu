// The LM head fused with cross-entropy on the GPU, as kernels/cpu/
// cross_entropy.cc: logits for kRows rows at a time (one cuBLASLt GEMM),
// then one block per row turns them into the row's loss and, for training,
// into d(loss_sum * grad_scale)/dlogits in place, then two GEMMs give dh
// (written) and dW (accumulated).

#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace apiary::kernels::cuda {

namespace {

constexpr int64_t kRows = 512;

struct Stats {
    double loss;
    unsigned long long count;
};

__global__ void softmax_xent_k(float* logits, const int32_t* targets, int64_t V, float grad_scale,
                               bool want_grad, Stats* stats) {
    __shared__ float shared[32];
    const int64_t row = blockIdx.x;
    float* x = logits + row * V;
    const int32_t target = targets[row];
    if (target < 0) {
        if (want_grad)
            for (int64_t v = threadIdx.x; v < V; v += blockDim.x) x[v] = 0.0f;
        return;
    }
    float mx = -INFINITY;
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x) mx = fmaxf(mx, x[v]);
    mx = detail::warp_max(mx);
    __syncthreads();
    if (threadIdx.x % 32 == 0) shared[threadIdx.x / 32] = mx;
    __syncthreads();
    mx = shared[0];
    for (int w = 1; w < int(blockDim.x / 32); ++w) mx = fmaxf(mx, shared[w]);
    float sum = 0.0f;
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x) sum += expf(x[v] - mx);
    const float lse = mx + logf(detail::block_sum(sum, shared));
    const float target_logit = x[target];
    __syncthreads();  // every thread has read x[target] before it is overwritten
    if (threadIdx.x == 0) {
        atomicAdd(&stats->loss, double(lse) - double(target_logit));
        atomicAdd(&stats->count, 1ull);
    }
    if (want_grad) {
        for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
            x[v] = expf(x[v] - lse) * grad_scale - (v == target ? grad_scale : 0.0f);
        }
    }
}

}  // namespace

int64_t lm_head_scratch_floats(int64_t N, int64_t V) { return std::min(N, kRows) * V; }
int64_t lm_head_stats_bytes() { return int64_t(sizeof(Stats)); }

double lm_head_cross_entropy(GemmContext& ctx, const float* h, const float* W,
                             const int32_t* targets, int64_t N, int64_t C, int64_t V,
                             float grad_scale, float* dh, float* dW, int64_t* valid, float* scratch,
                             int64_t scratch_floats, void* stats) {
    const int64_t rows = std::min(N, kRows);
    if (scratch_floats < rows * V) detail::unsupported("lm_head_cross_entropy: scratch too small");
    Stream s = ctx.stream();
    auto* st = static_cast<Stats*>(stats);
    APIARY_CUDA_CALL(cudaMemsetAsync(st, 0, sizeof(Stats), s));
    for (int64_t r0 = 0; r0 < N; r0 += rows) {
        const int64_t rn = std::min(rows, N - r0);
        gemm(ctx, false, true, rn, V, C, h + r0 * C, C, W, C, 0.0f, scratch, V);
        softmax_xent_k<<<unsigned(rn), 1024, 0, s>>>(scratch, targets + r0, V, grad_scale,
                                                     dh != nullptr, st);
        APIARY_CUDA_LAUNCHED("lm_head_cross_entropy");
        if (dh) {
            gemm(ctx, false, false, rn, C, V, scratch, V, W, C, 0.0f, dh + r0 * C, C);
            gemm(ctx, true, false, V, C, rn, scratch, V, h + r0 * C, C, 1.0f, dW, C);
        }
    }
    Stats host{};
    APIARY_CUDA_CALL(cudaMemcpyAsync(&host, st, sizeof(Stats), cudaMemcpyDeviceToHost, s));
    APIARY_CUDA_CALL(cudaStreamSynchronize(s));
    if (valid) *valid = int64_t(host.count);
    return host.loss;
}

}  // namespace apiary::kernels::cuda
