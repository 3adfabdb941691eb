// Causal grouped-query attention on the GPU, FlashAttention-2's scheme: a
// block owns 32 query rows of one (batch, head), streams 32-key tiles of K
// and V through shared memory and keeps an online softmax, so no (T, T)
// matrix exists. Inside a warp, lane j scores key j of the tile; each lane
// owns the output dimensions d = lane + 32 k (HS <= 128). The backward
// recomputes the probabilities from the saved log-sum-exp, in two passes
// that need no atomics: dQ by query rows, then dK and dV by key rows (a key
// row sums over every query head of its group). fp32 throughout; a
// tensor-core (bf16 wgmma) kernel is the next step, not this one.

#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace apiary::kernels::cuda {

using detail::warp_max;
using detail::warp_sum;

namespace {

constexpr int kTile = 32;  // keys (or queries) per shared tile: one per lane
constexpr int kWarps = 8;
constexpr int kRowsPerWarp = 4;  // kWarps * kRowsPerWarp = 32 rows per block
constexpr int kDims = 4;         // HS <= 32 * kDims
constexpr int kMaxHS = 32 * kDims;

struct Dims {
    int64_t T, NH, KVH, HS, row_stride;  // row_stride = (NH + 2 KVH) HS
    float scale;
};

// Shared layout of both passes: two tiles of kTile rows (padded by one float
// against bank conflicts) and per-warp row copies.
__host__ __device__ inline int64_t tile_floats(int64_t HS) { return kTile * (HS + 1); }
inline size_t shared_bytes(int64_t HS, int per_warp_rows) {
    return size_t(2 * tile_floats(HS) + int64_t(kWarps) * per_warp_rows * HS) * sizeof(float);
}

__device__ inline void load_tile(float* dst, const float* src, int64_t r0, int64_t rows_total,
                                 int64_t src_stride, int64_t HS) {
    for (int64_t i = threadIdx.x; i < kTile * HS; i += blockDim.x) {
        const int64_t j = i / HS, d = i % HS;
        dst[j * (HS + 1) + d] = (r0 + j < rows_total) ? src[(r0 + j) * src_stride + d] : 0.0f;
    }
}

// Two tiles of rows r0.. into shared memory, fenced on both sides so no warp
// still reads the previous tiles while they are overwritten.
__device__ inline void sync_load_tiles(float* a, const float* a_src, int64_t a_stride, float* b,
                                       const float* b_src, int64_t b_stride, int64_t r0,
                                       int64_t rows_total, int64_t HS) {
    __syncthreads();
    load_tile(a, a_src, r0, rows_total, a_stride, HS);
    load_tile(b, b_src, r0, rows_total, b_stride, HS);
    __syncthreads();
}

// A warp's kRowsPerWarp rows r0.. (times mul; zero past rows_total) into its
// own shared rows of HS floats.
__device__ inline void load_warp_rows(float* dst, const float* src, int64_t r0, int64_t rows_total,
                                      int64_t src_stride, int64_t HS, int lane, float mul = 1.0f) {
    for (int r = 0; r < kRowsPerWarp; ++r) {
        const int64_t i = r0 + r;
        for (int64_t d = lane; d < HS; d += 32)
            dst[r * HS + d] = i < rows_total ? src[i * src_stride + d] * mul : 0.0f;
    }
}

// acc[k] += w_j * tile[j][lane + 32 k] over the tile's first jn rows, w_j
// being lane j's w.
__device__ inline void accumulate_tile(float (&acc)[kDims], float w, const float* tile, int jn,
                                       int lane, int64_t HS) {
    for (int j = 0; j < jn; ++j) {
        const float wj = __shfl_sync(0xffffffffu, w, j);
#pragma unroll
        for (int k = 0; k < kDims; ++k) {
            const int64_t d = lane + 32 * k;
            if (d < HS) acc[k] += wj * tile[j * (HS + 1) + d];
        }
    }
}

// dst[lane + 32 k] = v[k] / div for the dimensions below HS.
__device__ inline void store_row(float* dst, const float (&v)[kDims], int lane, int64_t HS,
                                 float div = 1.0f) {
#pragma unroll
    for (int k = 0; k < kDims; ++k) {
        const int64_t d = lane + 32 * k;
        if (d < HS) dst[d] = v[k] / div;
    }
}

// Where query head h of batch b finds its rows and its group's K and V.
struct HeadRows {
    const float* base;  // batch b's first row
    const float* k;     // K of h's kv group, row 0
    const float* v;     // V of h's kv group, row 0
};
__device__ inline HeadRows head_rows(const float* qkv, int64_t b, int64_t h, const Dims& dm) {
    const int64_t g = h / (dm.NH / dm.KVH);
    const float* base = qkv + b * dm.T * dm.row_stride;
    return {base, base + (dm.NH + g) * dm.HS, base + (dm.NH + dm.KVH + g) * dm.HS};
}

__global__ void attention_forward_k(float* out, float* lse, const float* qkv, Dims dm) {
    extern __shared__ float sm[];
    const int64_t HS = dm.HS, T = dm.T;
    float* Ks = sm;
    float* Vs = Ks + tile_floats(HS);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float* Qs = Vs + tile_floats(HS) + int64_t(warp) * kRowsPerWarp * HS;
    const int64_t b = blockIdx.z, h = blockIdx.y, q0 = int64_t(blockIdx.x) * kTile;
    const HeadRows src = head_rows(qkv, b, h, dm);
    load_warp_rows(Qs, src.base + h * HS, q0 + warp * kRowsPerWarp, T, dm.row_stride, HS, lane,
                   dm.scale);
    float m[kRowsPerWarp], l[kRowsPerWarp], acc[kRowsPerWarp][kDims];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
#pragma unroll
        for (int k = 0; k < kDims; ++k) acc[r][k] = 0.0f;
    }
    const int64_t q_last = min(T - 1, q0 + kTile - 1);
    for (int64_t k0 = 0; k0 <= q_last; k0 += kTile) {
        sync_load_tiles(Ks, src.k, dm.row_stride, Vs, src.v, dm.row_stride, k0, T, HS);
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r) {
            const int64_t qi = q0 + warp * kRowsPerWarp + r;
            if (qi >= T || k0 > qi) continue;  // uniform across the warp
            const bool valid = k0 + lane <= qi;
            float s = 0.0f;
            for (int64_t d = 0; d < HS; ++d) s += Qs[r * HS + d] * Ks[lane * (HS + 1) + d];
            s = valid ? s : -INFINITY;
            const float m_new = fmaxf(m[r], warp_max(s));
            const float p = valid ? expf(s - m_new) : 0.0f;
            const float corr = expf(m[r] - m_new);  // 0 on the first tile (m = -inf)
            l[r] = l[r] * corr + warp_sum(p);
            const int jn = int(min(int64_t(kTile), qi - k0 + 1));
#pragma unroll
            for (int k = 0; k < kDims; ++k) acc[r][k] *= corr;
            accumulate_tile(acc[r], p, Vs, jn, lane, HS);
            m[r] = m_new;
        }
    }
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
        const int64_t qi = q0 + warp * kRowsPerWarp + r;
        if (qi >= T) continue;
        store_row(out + (b * T + qi) * dm.NH * HS + h * HS, acc[r], lane, HS, l[r]);
        if (lane == 0) lse[(b * dm.NH + h) * T + qi] = m[r] + logf(l[r]);
    }
}

// D (B, NH, T) = rowsum(dout * out), one warp per row.
__global__ void attention_delta_k(float* D, const float* dout, const float* out, int64_t rows,
                                  int64_t T, int64_t NH, int64_t HS) {
    const int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows) return;
    const int64_t h = row % NH, bt = row / NH, b = bt / T, t = bt % T;
    const float* o = out + bt * NH * HS + h * HS;
    const float* d = dout + bt * NH * HS + h * HS;
    float s = 0.0f;
    for (int64_t c = lane; c < HS; c += 32) s += o[c] * d[c];
    s = warp_sum(s);
    if (lane == 0) D[(b * NH + h) * T + t] = s;
}

// dQ rows: as the forward, with P from lse and dS = P (dO.V - D).
__global__ void attention_backward_dq_k(float* dqkv, const float* dout, const float* qkv,
                                        const float* lse, const float* D, Dims dm) {
    extern __shared__ float sm[];
    const int64_t HS = dm.HS, T = dm.T;
    float* Ks = sm;
    float* Vs = Ks + tile_floats(HS);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float* Qs = Vs + tile_floats(HS) + int64_t(warp) * 2 * kRowsPerWarp * HS;
    float* dOs = Qs + kRowsPerWarp * HS;
    const int64_t b = blockIdx.z, h = blockIdx.y, q0 = int64_t(blockIdx.x) * kTile;
    const HeadRows src = head_rows(qkv, b, h, dm);
    load_warp_rows(Qs, src.base + h * HS, q0 + warp * kRowsPerWarp, T, dm.row_stride, HS, lane,
                   dm.scale);
    load_warp_rows(dOs, dout + b * T * dm.NH * HS + h * HS, q0 + warp * kRowsPerWarp, T, dm.NH * HS,
                   HS, lane);
    float acc[kRowsPerWarp][kDims] = {};
    const int64_t q_last = min(T - 1, q0 + kTile - 1);
    for (int64_t k0 = 0; k0 <= q_last; k0 += kTile) {
        sync_load_tiles(Ks, src.k, dm.row_stride, Vs, src.v, dm.row_stride, k0, T, HS);
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r) {
            const int64_t qi = q0 + warp * kRowsPerWarp + r;
            if (qi >= T || k0 > qi) continue;
            const int64_t stat = (b * dm.NH + h) * T + qi;
            float s = 0.0f, dp = 0.0f;
            for (int64_t d = 0; d < HS; ++d) {
                s += Qs[r * HS + d] * Ks[lane * (HS + 1) + d];
                dp += dOs[r * HS + d] * Vs[lane * (HS + 1) + d];
            }
            const float p = (k0 + lane <= qi) ? expf(s - lse[stat]) : 0.0f;
            const float ds = p * (dp - D[stat]) * dm.scale;
            const int jn = int(min(int64_t(kTile), qi - k0 + 1));
            accumulate_tile(acc[r], ds, Ks, jn, lane, HS);
        }
    }
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
        const int64_t qi = q0 + warp * kRowsPerWarp + r;
        if (qi >= T) continue;
        store_row(dqkv + (b * T + qi) * dm.row_stride + h * HS, acc[r], lane, HS);
    }
}

// dK and dV rows of one kv head: every query row i >= j of every q head of
// the group contributes dV_j += P_ij dO_i and dK_j += dS_ij Q_i.
__global__ void attention_backward_dkv_k(float* dqkv, const float* dout, const float* qkv,
                                         const float* lse, const float* D, Dims dm) {
    extern __shared__ float sm[];
    const int64_t HS = dm.HS, T = dm.T;
    float* Qs = sm;  // tile of query rows (scaled q)
    float* dOs = Qs + tile_floats(HS);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float* Kr = dOs + tile_floats(HS) + int64_t(warp) * 2 * kRowsPerWarp * HS;
    float* Vr = Kr + kRowsPerWarp * HS;
    const int64_t b = blockIdx.z, g = blockIdx.y, k0 = int64_t(blockIdx.x) * kTile;
    const int64_t group = dm.NH / dm.KVH;
    const float* base = qkv + b * T * dm.row_stride;
    load_warp_rows(Kr, base + (dm.NH + g) * HS, k0 + warp * kRowsPerWarp, T, dm.row_stride, HS,
                   lane);
    load_warp_rows(Vr, base + (dm.NH + dm.KVH + g) * HS, k0 + warp * kRowsPerWarp, T, dm.row_stride,
                   HS, lane);
    float dk[kRowsPerWarp][kDims] = {}, dv[kRowsPerWarp][kDims] = {};
    for (int64_t h = g * group; h < (g + 1) * group; ++h) {
        for (int64_t i0 = k0; i0 < T; i0 += kTile) {
            sync_load_tiles(Qs, base + h * HS, dm.row_stride, dOs,
                            dout + b * T * dm.NH * HS + h * HS, dm.NH * HS, i0, T, HS);
            const int64_t qi = i0 + lane;
            const int64_t stat = (b * dm.NH + h) * T + min(qi, T - 1);
            const float lse_i = lse[stat], D_i = D[stat];
#pragma unroll
            for (int r = 0; r < kRowsPerWarp; ++r) {
                const int64_t kj = k0 + warp * kRowsPerWarp + r;
                if (kj >= T) continue;
                float s = 0.0f, dp = 0.0f;
                for (int64_t d = 0; d < HS; ++d) {
                    s += Qs[lane * (HS + 1) + d] * Kr[r * HS + d];
                    dp += dOs[lane * (HS + 1) + d] * Vr[r * HS + d];
                }
                const bool valid = qi < T && qi >= kj;
                const float p = valid ? expf(s * dm.scale - lse_i) : 0.0f;
                const float ds = p * (dp - D_i) * dm.scale;
                for (int j = 0; j < kTile; ++j) {
                    const float pj = __shfl_sync(0xffffffffu, p, j);
                    const float dsj = __shfl_sync(0xffffffffu, ds, j);
#pragma unroll
                    for (int k = 0; k < kDims; ++k) {
                        const int64_t d = lane + 32 * k;
                        if (d < HS) {
                            dv[r][k] += pj * dOs[j * (HS + 1) + d];
                            dk[r][k] += dsj * Qs[j * (HS + 1) + d];
                        }
                    }
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
        const int64_t kj = k0 + warp * kRowsPerWarp + r;
        if (kj >= T) continue;
        float* row = dqkv + (b * T + kj) * dm.row_stride;
        store_row(row + (dm.NH + g) * HS, dk[r], lane, HS);
        store_row(row + (dm.NH + dm.KVH + g) * HS, dv[r], lane, HS);
    }
}

Dims dims_of(int64_t T, int64_t NH, int64_t KVH, int64_t HS, const char* what) {
    if (HS > kMaxHS || NH % KVH != 0 || HS <= 0) {
        detail::unsupported(what);
    }
    return {T, NH, KVH, HS, (NH + 2 * KVH) * HS, 1.0f / std::sqrt(float(HS))};
}

// Shared memory above 48 KB needs an opt-in per kernel.
template <typename Kernel>
void allow_shared(Kernel k, size_t bytes) {
    if (bytes > 48 * 1024) {
        APIARY_CUDA_CALL(
            cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
    }
}

}  // namespace

void attention_forward(Stream s, float* out, float* lse, const float* qkv, int64_t B, int64_t T,
                       int64_t NH, int64_t KVH, int64_t HS) {
    const Dims dm = dims_of(T, NH, KVH, HS, "attention_forward: HS > 128 or NH % KVH != 0");
    const dim3 grid(unsigned((T + kTile - 1) / kTile), unsigned(NH), unsigned(B));
    const size_t bytes = shared_bytes(HS, kRowsPerWarp);
    allow_shared(attention_forward_k, bytes);
    attention_forward_k<<<grid, kWarps * 32, bytes, s>>>(out, lse, qkv, dm);
    APIARY_CUDA_LAUNCHED("attention_forward");
}

int64_t attention_backward_scratch(int64_t B, int64_t T, int64_t NH) { return B * NH * T; }

void attention_backward(Stream s, float* dqkv, const float* dout, const float* qkv,
                        const float* out, const float* lse, int64_t B, int64_t T, int64_t NH,
                        int64_t KVH, int64_t HS, float* scratch) {
    const Dims dm = dims_of(T, NH, KVH, HS, "attention_backward: HS > 128 or NH % KVH != 0");
    const int64_t rows = B * T * NH;
    attention_delta_k<<<unsigned((rows * 32 + 255) / 256), 256, 0, s>>>(scratch, dout, out, rows, T,
                                                                        NH, HS);
    APIARY_CUDA_LAUNCHED("attention_backward (delta)");
    const size_t bytes = shared_bytes(HS, 2 * kRowsPerWarp);
    allow_shared(attention_backward_dq_k, bytes);
    allow_shared(attention_backward_dkv_k, bytes);
    const unsigned tiles = unsigned((T + kTile - 1) / kTile);
    attention_backward_dq_k<<<dim3(tiles, unsigned(NH), unsigned(B)), kWarps * 32, bytes, s>>>(
        dqkv, dout, qkv, lse, scratch, dm);
    APIARY_CUDA_LAUNCHED("attention_backward (dq)");
    attention_backward_dkv_k<<<dim3(tiles, unsigned(KVH), unsigned(B)), kWarps * 32, bytes, s>>>(
        dqkv, dout, qkv, lse, scratch, dm);
    APIARY_CUDA_LAUNCHED("attention_backward (dk, dv)");
}

}  // namespace apiary::kernels::cuda
