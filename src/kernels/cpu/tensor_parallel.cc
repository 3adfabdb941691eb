// Kernels of tensor parallelism: a row-parallel matmul's bias added after
// its reduction, and a vocabulary split across tensor-parallel ranks (Megatron's
// VocabParallelEmbedding and vocab-parallel cross-entropy): each rank holds
// rows [v0, v0 + Vl) of the embedding / LM head. The embedding looks up the
// tokens it owns and writes zeros for the rest (the ranks' outputs are then
// summed); the head computes its slice of each row's logits, and the row
// max and sum of exponentials are combined across ranks through the
// caller's reductions between the passes of one row block. Rows a rank does
// not own never touch its gradients, and the softmax sees exactly the real
// vocabulary: there is no padding to exclude.

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"
#include "core/profile.h"
#include "kernels/cpu/omp_util.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/kernels.h"

namespace apiary::kernels {

void add_bias(float* y, const float* bias, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; ++i) {
        float* row = y + i * C;
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) row[c] += bias[c];
    }
}

void embedding_lookup(float* out, const int32_t* tokens, const float* wte, int64_t v0, int64_t Vl,
                      int64_t N, int64_t C) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; ++i) {
        const int64_t t = int64_t(tokens[i]) - v0;
        float* o = out + i * C;
        if (t < 0 || t >= Vl) {
            std::fill_n(o, C, 0.0f);
            continue;
        }
        const float* e = wte + t * C;
        for (int64_t c = 0; c < C; ++c) o[c] = e[c];
    }
}

void add_positions(float* out, const float* wpe, int64_t row0, int64_t T, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; ++i) {
        const float* p = wpe + ((row0 + i) % T) * C;
        float* o = out + i * C;
        for (int64_t c = 0; c < C; ++c) o[c] += p[c];
    }
}

void embedding_lookup_backward(float* dwte, const float* dout, const int32_t* tokens, int64_t v0,
                               int64_t Vl, int64_t N, int64_t C) {
    // Several rows may hit the same token: threads split the channels.
#pragma omp parallel
    {
        const int nt = omp_get_num_threads_safe();
        const int tid = omp_get_thread_num_safe();
        const int64_t c0 = C * tid / nt, c1 = C * (tid + 1) / nt;
        for (int64_t i = 0; i < N; ++i) {
            const int64_t t = int64_t(tokens[i]) - v0;
            if (t < 0 || t >= Vl) continue;
            float* e = dwte + t * C;
            const float* d = dout + i * C;
            for (int64_t c = c0; c < c1; ++c) e[c] += d[c];
        }
    }
}

void positions_backward(float* dwpe, const float* dout, int64_t row0, int64_t T, int64_t N,
                        int64_t C) {
#pragma omp parallel
    {
        const int nt = omp_get_num_threads_safe();
        const int tid = omp_get_thread_num_safe();
        const int64_t c0 = C * tid / nt, c1 = C * (tid + 1) / nt;
        for (int64_t i = 0; i < N; ++i) {
            float* p = dwpe + ((row0 + i) % T) * C;
            const float* d = dout + i * C;
            for (int64_t c = c0; c < c1; ++c) p[c] += d[c];
        }
    }
}

namespace {
constexpr int64_t kVpRows = 256;
}

int64_t lm_head_vp_scratch_floats(int64_t N, int64_t Vl) {
    const int64_t rows = std::min(N, kVpRows);
    return rows * Vl + 3 * rows;
}

double lm_head_cross_entropy_vp(const VocabHead& a, const int32_t* targets, int64_t N, int64_t C,
                                float grad_scale, float* dh, float* dW, int64_t* valid,
                                float* scratch, int64_t scratch_floats, uint16_t* scratch_bf16,
                                const RowReduce& reduce) {
    const bool bf16 = a.h16 != nullptr;
    const int64_t Vl = a.Vl, v0 = a.v0;
    const int64_t rows = std::min(N, kVpRows);
    APIARY_CHECK(scratch_floats >= lm_head_vp_scratch_floats(N, Vl),
                 "lm_head_cross_entropy_vp: scratch of {} floats, needs {}", scratch_floats,
                 lm_head_vp_scratch_floats(N, Vl));
    float* logits = scratch;          // (rn, Vl)
    float* mx = scratch + rows * Vl;  // (rn)
    float* sums = mx + rows;          // (2 rn): sum of exp, then the target's logit
    double loss_sum = 0.0;
    int64_t count = 0;
    for (int64_t r0 = 0; r0 < N; r0 += rows) {
        const int64_t rn = std::min(rows, N - r0);
        if (bf16) {
            gemm_bf16(false, true, rn, Vl, C, a.h16 + r0 * C, C, a.W16, C, 0.0f, logits, Vl);
        } else {
            gemm(false, true, rn, Vl, C, a.h + r0 * C, C, a.W, C, 0.0f, logits, Vl);
        }
        // Pass 1: the row max over every rank's slice.
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < rn; ++r) {
            const float* row = logits + r * Vl;
            float m = -std::numeric_limits<float>::infinity();
            for (int64_t v = 0; v < Vl; ++v) m = std::max(m, row[v]);
            mx[r] = m;
        }
        reduce.max(reduce.ctx, mx, rn);
        // Pass 2: sum of exponentials, and the target's logit where this
        // rank owns it (0 elsewhere), summed over ranks in one call.
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < rn; ++r) {
            const float* row = logits + r * Vl;
            float s = 0.0f;
#pragma omp simd reduction(+ : s)
            for (int64_t v = 0; v < Vl; ++v) s += detail::fast_exp(row[v] - mx[r]);
            sums[r] = s;
            const int64_t t = int64_t(targets[r0 + r]) - v0;
            sums[rn + r] = (t >= 0 && t < Vl) ? row[t] : 0.0f;
        }
        reduce.sum(reduce.ctx, sums, 2 * rn);
        double block_loss = 0.0;
        int64_t block_count = 0;
#pragma omp parallel for schedule(static) reduction(+ : block_loss, block_count)
        for (int64_t r = 0; r < rn; ++r) {
            float* row = logits + r * Vl;
            const int32_t target = targets[r0 + r];
            if (target < 0) {
                if (dh) std::fill_n(row, Vl, 0.0f);
                continue;
            }
            const float lse = mx[r] + std::log(sums[r]);
            block_loss += double(lse) - double(sums[rn + r]);
            block_count += 1;
            if (!dh) continue;
#pragma omp simd
            for (int64_t v = 0; v < Vl; ++v) row[v] = detail::fast_exp(row[v] - lse) * grad_scale;
            const int64_t t = int64_t(target) - v0;
            if (t >= 0 && t < Vl) row[t] -= grad_scale;
        }
        loss_sum += block_loss;
        count += block_count;
        if (!dh) continue;
        if (bf16) {
            to_bf16(scratch_bf16, logits, rn * Vl);
            gemm_bf16(false, false, rn, C, Vl, scratch_bf16, Vl, a.W16, C, 0.0f, dh + r0 * C, C);
            gemm_bf16(true, false, Vl, C, rn, scratch_bf16, Vl, a.h16 + r0 * C, C, 1.0f, dW, C);
        } else {
            gemm(false, false, rn, C, Vl, logits, Vl, a.W, C, 0.0f, dh + r0 * C, C);
            gemm(true, false, Vl, C, rn, logits, Vl, a.h + r0 * C, C, 1.0f, dW, C);
        }
    }
    if (valid) *valid = count;
    return loss_sum;
}

}  // namespace apiary::kernels
