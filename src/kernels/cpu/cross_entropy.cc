// The LM head fused with cross-entropy. Full (B*T, V) logits would be the
// largest activation of a small model (gpt2-124m at B=4, T=256: 206 MB), so
// logits only ever exist for a block of rows. Training processes kRows rows
// at a time over the whole vocabulary: softmax and its gradient come out of
// one GEMM with no recompute, which is why the block is over rows and not over
// vocabulary chunks (a vocabulary-chunked backward must recompute every chunk
// after the log-sum-exp is known: a third more head FLOPs). The forward-only
// path (evaluation) does stream over vocabulary chunks with an online
// log-sum-exp, holding (rows x chunk).

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"
#include "core/profile.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/kernels.h"

namespace apiary::kernels {

namespace {
constexpr int64_t kRows = 512;
}

int64_t lm_head_scratch_floats(int64_t N, int64_t V) { return std::min(N, kRows) * V; }
int64_t lm_head_scratch_bf16(int64_t N, int64_t V) { return 2 * std::min(N, kRows) * V; }

namespace {

// Turns a block of logits (rn, V) into per-row losses and, if want_grad,
// into d(loss_sum * grad_scale)/dlogits in place; rows with target < 0 count
// nothing and get zero gradient.
void softmax_xent_block(float* logits, const int32_t* targets, int64_t rn, int64_t V,
                        float grad_scale, bool want_grad, double* loss_sum, int64_t* count) {
    double block_loss = 0.0;
    int64_t block_count = 0;
#pragma omp parallel for schedule(static) reduction(+ : block_loss, block_count)
    for (int64_t r = 0; r < rn; ++r) {
        float* row = logits + r * V;
        const int32_t target = targets[r];
        if (target < 0) {
            if (want_grad) std::fill_n(row, V, 0.0f);
            continue;
        }
        float mx = -std::numeric_limits<float>::infinity();
        for (int64_t v = 0; v < V; ++v) mx = std::max(mx, row[v]);
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int64_t v = 0; v < V; ++v) sum += detail::fast_exp(row[v] - mx);
        const float lse = mx + std::log(sum);
        block_loss += double(lse) - double(row[target]);
        block_count += 1;
        if (want_grad) {
#pragma omp simd
            for (int64_t v = 0; v < V; ++v) row[v] = detail::fast_exp(row[v] - lse) * grad_scale;
            row[target] -= grad_scale;
        }
    }
    *loss_sum += block_loss;
    *count += block_count;
}

// dst (cols, rows) = src (rows, cols)^T in 32 x 32 tiles (cache-friendly on
// both sides), parallel over column tiles.
void transpose_u16(uint16_t* dst, const uint16_t* src, int64_t rows, int64_t cols) {
    constexpr int64_t kTile = 32;
#pragma omp parallel for schedule(static)
    for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
        const int64_t c1 = std::min(cols, c0 + kTile);
        for (int64_t r0 = 0; r0 < rows; r0 += kTile) {
            const int64_t r1 = std::min(rows, r0 + kTile);
            for (int64_t c = c0; c < c1; ++c) {
                for (int64_t r = r0; r < r1; ++r) dst[c * rows + r] = src[r * cols + c];
            }
        }
    }
}

}  // namespace

double lm_head_cross_entropy(const float* h, const float* W, const int32_t* targets, int64_t N,
                             int64_t C, int64_t V, float grad_scale, float* dh, float* dW,
                             int64_t* valid, float* scratch, int64_t scratch_floats) {
    const int64_t rows = std::min(N, kRows);
    APIARY_CHECK(scratch_floats >= rows * V, "lm_head_cross_entropy: scratch of {} floats, needs {}", scratch_floats, rows * V);
    double loss_sum = 0.0;
    int64_t count = 0;
    for (int64_t r0 = 0; r0 < N; r0 += rows) {
        const int64_t rn = std::min(rows, N - r0);
        float* logits = scratch;  // (rn, V)
        gemm(false, true, rn, V, C, h + r0 * C, C, W, C, 0.0f, logits, V);
        softmax_xent_block(logits, targets + r0, rn, V, grad_scale, dh != nullptr, &loss_sum,
                           &count);
        if (dh) {
            gemm(false, false, rn, C, V, logits, V, W, C, 0.0f, dh + r0 * C, C);
            gemm(true, false, V, C, rn, logits, V, h + r0 * C, C, 1.0f, dW, C);
        }
    }
    if (valid) *valid = count;
    return loss_sum;
}

double lm_head_cross_entropy_bf16(const uint16_t* h, const uint16_t* W, const int32_t* targets,
                                  int64_t N, int64_t C, int64_t V, float grad_scale, float* dh,
                                  float* dW, int64_t* valid, float* scratch,
                                  int64_t scratch_floats, uint16_t* scratch_bf16) {
    const int64_t rows = std::min(N, kRows);
    APIARY_CHECK(scratch_floats >= rows * V, "lm_head_cross_entropy_bf16: scratch of {} floats, needs {}", scratch_floats, rows * V);
    double loss_sum = 0.0;
    int64_t count = 0;
    for (int64_t r0 = 0; r0 < N; r0 += rows) {
        const int64_t rn = std::min(rows, N - r0);
        float* logits = scratch;
        {
            APIARY_PROFILE("head: logits gemm");
            gemm_bf16(false, true, rn, V, C, h + r0 * C, C, W, C, 0.0f, logits, V);
        }
        {
            APIARY_PROFILE("head: softmax");
            softmax_xent_block(logits, targets + r0, rn, V, grad_scale, dh != nullptr, &loss_sum,
                               &count);
        }
        if (dh) {
            // The logit gradients go back through bf16 matmuls like any other.
            {
                APIARY_PROFILE("head: to bf16");
                to_bf16(scratch_bf16, logits, rn * V);
            }
            {
                APIARY_PROFILE("head: dh gemm");
                gemm_bf16(false, false, rn, C, V, scratch_bf16, V, W, C, 0.0f, dh + r0 * C, C);
            }
            // oneDNN's bf16 matmul is 2x slower on a transposed (strided)
            // operand than the explicit transpose costs.
            uint16_t* dlogits_t = scratch_bf16 + rn * V;  // (V, rn)
            {
                APIARY_PROFILE("head: transpose");
                transpose_u16(dlogits_t, scratch_bf16, rn, V);
            }
            APIARY_PROFILE("head: dW gemm");
            gemm_bf16(false, false, V, C, rn, dlogits_t, rn, h + r0 * C, C, 1.0f, dW, C);
        }
    }
    if (valid) *valid = count;
    return loss_sum;
}

void lm_head_logsumexp(float* lse, float* target_logit, const float* h, const float* W,
                       const int32_t* targets, int64_t N, int64_t C, int64_t V,
                       int64_t vocab_chunk) {
    const int64_t rows = std::min(N, kRows);
    const int64_t chunk = std::min(V, std::max<int64_t>(1, vocab_chunk));
    std::vector<float> logits(size_t(rows * chunk));
    std::vector<float> mx(static_cast<size_t>(rows)), sum(static_cast<size_t>(rows));
    for (int64_t r0 = 0; r0 < N; r0 += rows) {
        const int64_t rn = std::min(rows, N - r0);
        std::fill(mx.begin(), mx.end(), -std::numeric_limits<float>::infinity());
        std::fill(sum.begin(), sum.end(), 0.0f);
        for (int64_t v0 = 0; v0 < V; v0 += chunk) {
            const int64_t vn = std::min(chunk, V - v0);
            gemm(false, true, rn, vn, C, h + r0 * C, C, W + v0 * C, C, 0.0f, logits.data(), vn);
#pragma omp parallel for schedule(static)
            for (int64_t r = 0; r < rn; ++r) {
                const float* row = logits.data() + r * vn;
                float m = mx[r];
                for (int64_t v = 0; v < vn; ++v) m = std::max(m, row[v]);
                float s = 0.0f;
#pragma omp simd reduction(+ : s)
                for (int64_t v = 0; v < vn; ++v) s += detail::fast_exp(row[v] - m);
                sum[r] = sum[r] * detail::fast_exp(mx[r] - m) + s;
                mx[r] = m;
                const int32_t t = targets ? targets[r0 + r] : -1;
                if (t >= v0 && t < v0 + vn) target_logit[r0 + r] = row[t - v0];
            }
        }
        for (int64_t r = 0; r < rn; ++r) lse[r0 + r] = mx[r] + std::log(sum[r]);
    }
}

}  // namespace apiary::kernels
