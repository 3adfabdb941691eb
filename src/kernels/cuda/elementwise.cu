// Embedding, normalisation, activations, rotary embedding, casts and AdamW on
// the GPU: memory-bound kernels, one pass each, with the CPU kernels'
// formulas (kernels/cpu/elementwise.cc, optim.cc). Reductions over rows that
// feed parameter gradients (norm weights, biases) sum a chunk of rows per
// thread and add the chunk's sum atomically, and the token-embedding scatter
// uses atomics (rows may share a token): those gradients are not bitwise
// deterministic from run to run (fp32 sums in varying order).

#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace apiary::kernels::cuda {

using detail::block_sum;
using detail::grid_for;
using detail::kThreads;

namespace {

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)

__global__ void embedding_forward_k(float* out, const int32_t* tokens, const float* wte,
                                    const float* wpe, int64_t N, int64_t T, int64_t C) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < N * C;
         i += int64_t(gridDim.x) * blockDim.x) {
        const int64_t row = i / C, c = i % C;
        float v = wte[int64_t(tokens[row]) * C + c];
        if (wpe) v += wpe[(row % T) * C + c];
        out[i] = v;
    }
}

__global__ void embedding_backward_wte_k(float* dwte, const float* dout, const int32_t* tokens,
                                         int64_t N, int64_t C) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < N * C;
         i += int64_t(gridDim.x) * blockDim.x) {
        const int64_t row = i / C, c = i % C;
        atomicAdd(dwte + int64_t(tokens[row]) * C + c, dout[i]);
    }
}

// dwpe (T, C) += sum over the batch, one thread per (t, c), batch in order.
__global__ void embedding_backward_wpe_k(float* dwpe, const float* dout, int64_t B, int64_t T,
                                         int64_t C) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < T * C;
         i += int64_t(gridDim.x) * blockDim.x) {
        float s = 0.0f;
        for (int64_t b = 0; b < B; ++b) s += dout[b * T * C + i];
        dwpe[i] += s;
    }
}

// One block per row: two passes (mean, then variance) as the CPU kernel.
__global__ void layernorm_forward_k(float* out, float* mean, float* rstd, const float* x,
                                    const float* weight, const float* bias, int64_t C, float eps) {
    __shared__ float shared[32];
    const int64_t row = blockIdx.x;
    const float* xi = x + row * C;
    float s = 0.0f;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) s += xi[c];
    const float m = block_sum(s, shared) / float(C);
    float v = 0.0f;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
        const float d = xi[c] - m;
        v += d * d;
    }
    const float r = rsqrtf(block_sum(v, shared) / float(C) + eps);
    float* o = out + row * C;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
        o[c] = (xi[c] - m) * r * weight[c] + bias[c];
    if (threadIdx.x == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
}

__global__ void layernorm_backward_dx_k(float* dx, const float* dout, const float* x,
                                        const float* weight, const float* mean, const float* rstd,
                                        int64_t C) {
    __shared__ float shared[32];
    const int64_t row = blockIdx.x;
    const float* xi = x + row * C;
    const float* di = dout + row * C;
    const float m = mean[row], r = rstd[row];
    float sg = 0.0f, sgx = 0.0f;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
        const float g = di[c] * weight[c];
        sg += g;
        sgx += g * (xi[c] - m) * r;
    }
    sg = block_sum(sg, shared) / float(C);
    sgx = block_sum(sgx, shared) / float(C);
    float* dxi = dx + row * C;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
        const float xhat = (xi[c] - m) * r;
        dxi[c] += (di[c] * weight[c] - sg - xhat * sgx) * r;
    }
}

// Rows per thread in the column reductions: enough blocks to fill the GPU at
// a few thousand rows, few enough atomics.
constexpr int64_t kRowChunk = 128;

inline dim3 column_grid(int64_t C, int64_t N, int threads) {
    return dim3(unsigned((C + threads - 1) / threads),
                unsigned(std::clamp<int64_t>((N + kRowChunk - 1) / kRowChunk, 1, 65535)));
}

// dweight (and dbias) += column sums over rows: a thread per column and
// chunk of rows (blockIdx.y), the chunk's sum added atomically.
__global__ void norm_backward_dw_k(float* dweight, float* dbias, const float* dout, const float* x,
                                   const float* mean, const float* rstd, int64_t N, int64_t C) {
    const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
    const int64_t rows_per = (N + gridDim.y - 1) / gridDim.y;
    const int64_t i0 = blockIdx.y * rows_per, i1 = min(N, i0 + rows_per);
    if (c < C && i0 < i1) {
        float sw = 0.0f, sb = 0.0f;
        for (int64_t i = i0; i < i1; ++i) {
            const float d = dout[i * C + c];
            const float m = mean ? mean[i] : 0.0f;
            sw += d * (x[i * C + c] - m) * rstd[i];
            sb += d;
        }
        atomicAdd(dweight + c, sw);
        if (dbias) atomicAdd(dbias + c, sb);
    }
}

__global__ void rmsnorm_forward_k(float* out, float* rstd, const float* x, const float* weight,
                                  int64_t C, float eps) {
    __shared__ float shared[32];
    const int64_t row = blockIdx.x;
    const float* xi = x + row * C;
    float ss = 0.0f;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) ss += xi[c] * xi[c];
    const float r = rsqrtf(block_sum(ss, shared) / float(C) + eps);
    float* o = out + row * C;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) o[c] = xi[c] * r * weight[c];
    if (threadIdx.x == 0) rstd[row] = r;
}

__global__ void rmsnorm_backward_dx_k(float* dx, const float* dout, const float* x,
                                      const float* weight, const float* rstd, int64_t C) {
    __shared__ float shared[32];
    const int64_t row = blockIdx.x;
    const float* xi = x + row * C;
    const float* di = dout + row * C;
    const float r = rstd[row];
    float sgx = 0.0f;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) sgx += di[c] * weight[c] * xi[c];
    const float k = block_sum(sgx, shared) * r * r * r / float(C);
    float* dxi = dx + row * C;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
        dxi[c] += di[c] * weight[c] * r - xi[c] * k;
}

#define APIARY_GRID_STRIDE(i, n)                                              \
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < (n); \
         i += int64_t(gridDim.x) * blockDim.x)

__global__ void gelu_forward_k(float* out, const float* x, int64_t n) {
    APIARY_GRID_STRIDE(i, n) {
        const float v = x[i];
        const float u = kGeluScale * (v + 0.044715f * v * v * v);
        out[i] = 0.5f * v * (1.0f + tanhf(u));
    }
}

__global__ void gelu_backward_k(float* dx, const float* x, const float* dout, int64_t n) {
    APIARY_GRID_STRIDE(i, n) {
        const float v = x[i];
        const float th = tanhf(kGeluScale * (v + 0.044715f * v * v * v));
        const float du = kGeluScale * (1.0f + 3.0f * 0.044715f * v * v);
        dx[i] = dout[i] * (0.5f * (1.0f + th) + 0.5f * v * (1.0f - th * th) * du);
    }
}

__global__ void swiglu_forward_k(float* out, const float* h, int64_t N, int64_t F) {
    APIARY_GRID_STRIDE(i, N * F) {
        const int64_t row = i / F, j = i % F;
        const float a = h[row * 2 * F + j], b = h[row * 2 * F + F + j];
        out[i] = a / (1.0f + expf(-a)) * b;
    }
}

__global__ void swiglu_backward_k(float* dh, const float* dout, const float* h, int64_t N,
                                  int64_t F) {
    APIARY_GRID_STRIDE(i, N * F) {
        const int64_t row = i / F, j = i % F;
        const float a = h[row * 2 * F + j], b = h[row * 2 * F + F + j];
        const float s = 1.0f / (1.0f + expf(-a));
        dh[row * 2 * F + F + j] = dout[i] * a * s;
        dh[row * 2 * F + j] = dout[i] * b * s * (1.0f + a * (1.0f - s));
    }
}

__global__ void rope_apply_k(float* x, const float* cos_table, const float* sin_table, int64_t N,
                             int64_t T, int64_t row_stride, int64_t offset, int64_t heads,
                             int64_t HS, float sign) {
    const int64_t half = HS / 2;
    APIARY_GRID_STRIDE(i, N * heads * half) {
        const int64_t k = i % half, h = (i / half) % heads, bt = i / (half * heads);
        const int64_t t = bt % T;
        float* v = x + bt * row_stride + offset + h * HS;
        const float a = v[k], b = v[k + half];
        const float c = cos_table[t * half + k], s = sign * sin_table[t * half + k];
        v[k] = a * c - b * s;
        v[k + half] = b * c + a * s;
    }
}

__global__ void add_bias_k(float* y, const float* bias, int64_t N, int64_t C) {
    APIARY_GRID_STRIDE(i, N * C) { y[i] += bias[i % C]; }
}

__global__ void column_sums_k(float* sums, const float* x, int64_t N, int64_t C) {
    const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
    const int64_t rows_per = (N + gridDim.y - 1) / gridDim.y;
    const int64_t i0 = blockIdx.y * rows_per, i1 = min(N, i0 + rows_per);
    if (c < C && i0 < i1) {
        float s = 0.0f;
        for (int64_t i = i0; i < i1; ++i) s += x[i * C + c];
        atomicAdd(sums + c, s);
    }
}

__global__ void to_bf16_k(uint16_t* dst, const float* src, int64_t n) {
    APIARY_GRID_STRIDE(i, n) { dst[i] = detail::bf16_bits(src[i]); }
}
__global__ void from_bf16_k(float* dst, const uint16_t* src, int64_t n) {
    APIARY_GRID_STRIDE(i, n) { dst[i] = detail::bf16_value(src[i]); }
}
__global__ void round_f16_k(float* dst, const float* src, int64_t n) {
    APIARY_GRID_STRIDE(i, n) { dst[i] = __half2float(__float2half_rn(src[i])); }
}
__global__ void scale_k(float* x, int64_t n, float s) {
    APIARY_GRID_STRIDE(i, n) { x[i] *= s; }
}
__global__ void add_k(float* y, const float* x, int64_t n) {
    APIARY_GRID_STRIDE(i, n) { y[i] += x[i]; }
}

constexpr int kSumBlocks = 1024;

__global__ void sum_squares_k(double* partial, const float* x, int64_t n) {
    __shared__ double shared[32];
    double s = 0.0;
    APIARY_GRID_STRIDE(i, n) { s += double(x[i]) * double(x[i]); }
    s = block_sum(s, shared);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}
__global__ void sum_partials_k(double* partial, int count) {
    __shared__ double shared[32];
    double s = 0.0;
    for (int i = threadIdx.x; i < count; i += blockDim.x) s += partial[i];
    s = block_sum(s, shared);
    if (threadIdx.x == 0) partial[0] = s;
}
__global__ void nonfinite_k(int* flag, const float* x, int64_t n) {
    APIARY_GRID_STRIDE(i, n) {
        if (!isfinite(x[i])) *flag = 1;
    }
}

struct AdamW {
    float beta1, beta2, eps, step, inv_sqrt_bc2, decay, grad_scale;
};

AdamW adamw_constants(float lr, float beta1, float beta2, float eps, float weight_decay, int64_t t,
                      float grad_scale) {
    // As kernels/cpu/optim.cc: bias corrections in double, then float.
    const float bc1 = 1.0f - float(std::pow(double(beta1), double(t)));
    const float bc2 = 1.0f - float(std::pow(double(beta2), double(t)));
    return {beta1,     beta2, eps, lr / bc1, 1.0f / std::sqrt(bc2), 1.0f - lr * weight_decay,
            grad_scale};
}

__global__ void adamw_k(AdamW k, float* param, uint16_t* param_bf16, const float* grad, float* m,
                        float* v, int64_t n) {
    APIARY_GRID_STRIDE(i, n) {
        const float g = grad[i] * k.grad_scale;
        const float mi = k.beta1 * m[i] + (1.0f - k.beta1) * g;
        const float vi = k.beta2 * v[i] + (1.0f - k.beta2) * g * g;
        m[i] = mi;
        v[i] = vi;
        const float p = param[i] * k.decay - k.step * mi / (sqrtf(vi) * k.inv_sqrt_bc2 + k.eps);
        param[i] = p;
        if (param_bf16) param_bf16[i] = detail::bf16_bits(p);
    }
}

}  // namespace

void embedding_forward(Stream s, float* out, const int32_t* tokens, const float* wte,
                       const float* wpe, int64_t B, int64_t T, int64_t C) {
    embedding_forward_k<<<grid_for(B * T * C), kThreads, 0, s>>>(out, tokens, wte, wpe, B * T, T,
                                                                 C);
    APIARY_CUDA_LAUNCHED("embedding_forward");
}

void embedding_backward(Stream s, float* dwte, float* dwpe, const float* dout,
                        const int32_t* tokens, int64_t B, int64_t T, int64_t C) {
    embedding_backward_wte_k<<<grid_for(B * T * C), kThreads, 0, s>>>(dwte, dout, tokens, B * T, C);
    APIARY_CUDA_LAUNCHED("embedding_backward");
    if (dwpe) {
        embedding_backward_wpe_k<<<grid_for(T * C), kThreads, 0, s>>>(dwpe, dout, B, T, C);
        APIARY_CUDA_LAUNCHED("embedding_backward (positions)");
    }
}

void layernorm_forward(Stream s, float* out, float* mean, float* rstd, const float* x,
                       const float* weight, const float* bias, int64_t N, int64_t C, float eps) {
    if (N == 0) return;
    layernorm_forward_k<<<unsigned(N), kThreads, 0, s>>>(out, mean, rstd, x, weight, bias, C, eps);
    APIARY_CUDA_LAUNCHED("layernorm_forward");
}

void layernorm_backward(Stream s, float* dx, float* dweight, float* dbias, const float* dout,
                        const float* x, const float* weight, const float* mean, const float* rstd,
                        int64_t N, int64_t C) {
    if (N == 0) return;
    layernorm_backward_dx_k<<<unsigned(N), kThreads, 0, s>>>(dx, dout, x, weight, mean, rstd, C);
    APIARY_CUDA_LAUNCHED("layernorm_backward");
    norm_backward_dw_k<<<column_grid(C, N, 128), 128, 0, s>>>(dweight, dbias, dout, x, mean, rstd,
                                                              N, C);
    APIARY_CUDA_LAUNCHED("layernorm_backward (weights)");
}

void rmsnorm_forward(Stream s, float* out, float* rstd, const float* x, const float* weight,
                     int64_t N, int64_t C, float eps) {
    if (N == 0) return;
    rmsnorm_forward_k<<<unsigned(N), kThreads, 0, s>>>(out, rstd, x, weight, C, eps);
    APIARY_CUDA_LAUNCHED("rmsnorm_forward");
}

void rmsnorm_backward(Stream s, float* dx, float* dweight, const float* dout, const float* x,
                      const float* weight, const float* rstd, int64_t N, int64_t C) {
    if (N == 0) return;
    rmsnorm_backward_dx_k<<<unsigned(N), kThreads, 0, s>>>(dx, dout, x, weight, rstd, C);
    APIARY_CUDA_LAUNCHED("rmsnorm_backward");
    norm_backward_dw_k<<<column_grid(C, N, 128), 128, 0, s>>>(dweight, nullptr, dout, x, nullptr,
                                                              rstd, N, C);
    APIARY_CUDA_LAUNCHED("rmsnorm_backward (weights)");
}

void gelu_forward(Stream s, float* out, const float* x, int64_t n) {
    gelu_forward_k<<<grid_for(n), kThreads, 0, s>>>(out, x, n);
    APIARY_CUDA_LAUNCHED("gelu_forward");
}
void gelu_backward(Stream s, float* dx, const float* x, const float* dout, int64_t n) {
    gelu_backward_k<<<grid_for(n), kThreads, 0, s>>>(dx, x, dout, n);
    APIARY_CUDA_LAUNCHED("gelu_backward");
}
void swiglu_forward(Stream s, float* out, const float* h, int64_t N, int64_t F) {
    swiglu_forward_k<<<grid_for(N * F), kThreads, 0, s>>>(out, h, N, F);
    APIARY_CUDA_LAUNCHED("swiglu_forward");
}
void swiglu_backward(Stream s, float* dh, const float* dout, const float* h, int64_t N, int64_t F) {
    swiglu_backward_k<<<grid_for(N * F), kThreads, 0, s>>>(dh, dout, h, N, F);
    APIARY_CUDA_LAUNCHED("swiglu_backward");
}
void rope_apply(Stream s, float* x, const float* cos_table, const float* sin_table, int64_t B,
                int64_t T, int64_t row_stride, int64_t offset, int64_t heads, int64_t HS,
                bool inverse) {
    rope_apply_k<<<grid_for(B * T * heads * (HS / 2)), kThreads, 0, s>>>(
        x, cos_table, sin_table, B * T, T, row_stride, offset, heads, HS, inverse ? -1.0f : 1.0f);
    APIARY_CUDA_LAUNCHED("rope_apply");
}
void add_bias(Stream s, float* y, const float* bias, int64_t N, int64_t C) {
    add_bias_k<<<grid_for(N * C), kThreads, 0, s>>>(y, bias, N, C);
    APIARY_CUDA_LAUNCHED("add_bias");
}
void linear_bias_backward(Stream s, float* dbias, const float* dy, int64_t N, int64_t OUT) {
    if (N == 0) return;
    column_sums_k<<<column_grid(OUT, N, 128), 128, 0, s>>>(dbias, dy, N, OUT);
    APIARY_CUDA_LAUNCHED("linear_bias_backward");
}

void to_bf16(Stream s, uint16_t* dst, const float* src, int64_t n) {
    to_bf16_k<<<grid_for(n), kThreads, 0, s>>>(dst, src, n);
    APIARY_CUDA_LAUNCHED("to_bf16");
}
void from_bf16(Stream s, float* dst, const uint16_t* src, int64_t n) {
    from_bf16_k<<<grid_for(n), kThreads, 0, s>>>(dst, src, n);
    APIARY_CUDA_LAUNCHED("from_bf16");
}
void copy_round_to_f16(Stream s, float* dst, const float* src, int64_t n) {
    round_f16_k<<<grid_for(n), kThreads, 0, s>>>(dst, src, n);
    APIARY_CUDA_LAUNCHED("copy_round_to_f16");
}
void round_to_f16(Stream s, float* x, int64_t n) { copy_round_to_f16(s, x, x, n); }
void scale_inplace(Stream s, float* x, int64_t n, float scale) {
    scale_k<<<grid_for(n), kThreads, 0, s>>>(x, n, scale);
    APIARY_CUDA_LAUNCHED("scale_inplace");
}
void add_inplace(Stream s, float* y, const float* x, int64_t n) {
    add_k<<<grid_for(n), kThreads, 0, s>>>(y, x, n);
    APIARY_CUDA_LAUNCHED("add_inplace");
}

int64_t sum_squares_scratch() { return kSumBlocks; }

double sum_squares(Stream s, const float* x, int64_t n, double* partial) {
    sum_squares_k<<<kSumBlocks, kThreads, 0, s>>>(partial, x, n);
    APIARY_CUDA_LAUNCHED("sum_squares");
    sum_partials_k<<<1, 1024, 0, s>>>(partial, kSumBlocks);
    APIARY_CUDA_LAUNCHED("sum_squares (partials)");
    double total = 0.0;
    APIARY_CUDA_CALL(cudaMemcpyAsync(&total, partial, sizeof(double), cudaMemcpyDeviceToHost, s));
    APIARY_CUDA_CALL(cudaStreamSynchronize(s));
    return total;
}

bool has_nonfinite(Stream s, const float* x, int64_t n, int* flag) {
    APIARY_CUDA_CALL(cudaMemsetAsync(flag, 0, sizeof(int), s));
    nonfinite_k<<<grid_for(n), kThreads, 0, s>>>(flag, x, n);
    APIARY_CUDA_LAUNCHED("has_nonfinite");
    int host = 0;
    APIARY_CUDA_CALL(cudaMemcpyAsync(&host, flag, sizeof(int), cudaMemcpyDeviceToHost, s));
    APIARY_CUDA_CALL(cudaStreamSynchronize(s));
    return host != 0;
}

void adamw_update(Stream s, float* param, const float* grad, float* m, float* v, int64_t n,
                  float lr, float beta1, float beta2, float eps, float weight_decay, int64_t t,
                  float grad_scale) {
    adamw_update_bf16_copy(s, param, nullptr, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, t,
                           grad_scale);
}

void adamw_update_bf16_copy(Stream s, float* param, uint16_t* param_bf16, const float* grad,
                            float* m, float* v, int64_t n, float lr, float beta1, float beta2,
                            float eps, float weight_decay, int64_t t, float grad_scale) {
    const AdamW k = adamw_constants(lr, beta1, beta2, eps, weight_decay, t, grad_scale);
    adamw_k<<<grid_for(n), kThreads, 0, s>>>(k, param, param_bf16, grad, m, v, n);
    APIARY_CUDA_LAUNCHED("adamw_update");
}

}  // namespace apiary::kernels::cuda
