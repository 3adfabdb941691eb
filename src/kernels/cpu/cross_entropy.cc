// The LM head fused with cross-entropy. Full (B*T, V) logits would be the
// largest activation of a small model (gpt2-124m at B=4, T=256: 206 MB), so
// logits only ever exist for a block of rows. Training processes kRows rows
// at a time over the whole vocabulary: softmax and its gradient come out of
// one GEMM with no recompute, which is why the block is over rows and not over
// vocabulary chunks (a vocabulary-chunked backward must recompute every chunk
// after the log-sum-exp is known: a third more head FLOPs). The forward-only
// path (evaluation) does stream over vocabulary chunks with an online
// log-sum-exp, holding (rows x chunk). The bf16 path rounds the logit
// gradients to bf16 transposed, (V, rows), in the same pass that computes
// them, and adds them into dW once per 1024 rows.

// GCC 12 warns inside its own AVX-512 intrinsics (a known false positive on
// the unused upper half of a mask register), as in matmul_bf16.cc.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"
#include "core/profile.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/cpu/simd.h"
#include "kernels/kernels.h"

namespace apiary::kernels {

using namespace simd;  // NOLINT: the 16-lane vocabulary of these kernels

namespace {
constexpr int64_t kRows = 512;
}

int64_t lm_head_scratch_floats(int64_t N, int64_t V) { return std::min(N, kRows) * V; }

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

namespace {

// The bf16 head keeps the logit gradients of up to this many rows, transposed
// (V, rows), and multiplies them into dW once: one pass over the fp32 dW
// (V, C) per kDwRows rows instead of one per kRows-row block.
constexpr int64_t kDwRows = 1024;
constexpr int64_t kDwVocabChunk = 16384;

// Each row's log-sum-exp (lse) and gradient factor (grad_scale, or 0 for a
// row whose target is < 0), and the block's loss: the first two passes of
// softmax_xent_block.
void row_statistics(const float* logits, const int32_t* targets, int64_t rn, int64_t V,
                    float grad_scale, float* lse, float* factor, double* loss_sum, int64_t* count) {
    double block_loss = 0.0;
    int64_t block_count = 0;
#pragma omp parallel for schedule(static) reduction(+ : block_loss, block_count)
    for (int64_t r = 0; r < rn; ++r) {
        // Written out: GCC does not vectorise a float max reduction without
        // -ffast-math, and the scalar loop took most of this pass. The
        // second pass reads the row (200 KB for GPT-2) from L2.
        const float* row = logits + r * V;
        const Vf neg_inf = set1(-std::numeric_limits<float>::infinity());
        const int64_t full = V / 16 * 16;
        const Mask tail = first_lanes(V - full);
        Vf mx = mask_loadu(neg_inf, tail, row + full);
        for (int64_t v = 0; v < full; v += 16) mx = max(mx, loadu(row + v));
        const float m = reduce_max(mx);
        const Vf mv = set1(m);
        Vf sum = maskz_mov(
            tail, simd::exp(sub(maskz_loadu(tail, row + full), mv)));
        for (int64_t v = 0; v < full; v += 16) {
            sum =
                add(sum, simd::exp(sub(loadu(row + v), mv)));
        }
        lse[r] = m + std::log(reduce_add(sum));
        factor[r] = targets[r] < 0 ? 0.0f : grad_scale;
        if (targets[r] < 0) continue;
        block_loss += double(lse[r]) - double(row[targets[r]]);
        block_count += 1;
    }
    *loss_sum += block_loss;
    *count += block_count;
}

// The softmax gradient's last pass fused with its bf16 rounding and its
// transpose: dl_t[v * ld + r] = bf16((exp(logit[r][v] - lse[r]) - [v ==
// target[r]]) * factor[r]) for r < rn, 16 x 16 tiles at a time. The
// transposed layout is the one both backward GEMMs read (dW as its left
// operand; dh, faster with oneDNN than from the row-major copy, transposed).
void gradient_transposed(const float* logits, const int32_t* targets, const float* lse,
                         const float* factor, int64_t rn, int64_t V, uint16_t* dl_t, int64_t ld) {
    // Chunks of 256 columns, rows in groups of 16 within a chunk: reads 16
    // rows x 1 KB at a time, and the chunk's 256 output rows (rn x 2 bytes
    // each) stay in cache until full. Tile by tile over all rows instead
    // streams 512 rows at once, more than the prefetchers follow (2x slower).
    constexpr int64_t kChunk = 256;
    const int64_t chunks = (V + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static)
    for (int64_t chunk = 0; chunk < chunks; ++chunk) {
        const int64_t c1 = std::min(V, (chunk + 1) * kChunk);
        for (int64_t r0 = 0; r0 < rn; r0 += 16) {
            for (int64_t v0 = chunk * kChunk; v0 < c1; v0 += 16) {
                const Mask cols = first_lanes(V - v0);
                Vf x[16];
                for (int i = 0; i < 16; ++i) {
                    const int64_t r = r0 + i;
                    if (r >= rn) {
                        x[i] = zero();
                        continue;
                    }
                    // Unmasked but for the last, partial tile: masked loads
                    // are 2x slower on this machine.
                    const float* src = logits + r * V + v0;
                    const Vf z = sub(
                        cols == 0xFFFF ? loadu(src) : maskz_loadu(cols, src),
                        set1(lse[r]));
                    Vf p = mul(simd::exp(z), set1(factor[r]));
                    const int64_t t = targets[r] - v0;
                    if (t >= 0 && t < 16) {
                        p = mask_sub(p, Mask(1u << t), p, set1(factor[r]));
                    }
                    x[i] = p;
                }
                transpose16(x);
                const Mask rows = first_lanes(rn - r0);
                for (int j = 0; j < 16 && v0 + j < V; ++j) {
                    uint16_t* dst = dl_t + (v0 + j) * ld + r0;
                    if (rows == 0xFFFF) {
                        store_bf16(dst, x[j]);
                    } else {
                        mask_store_bf16(dst, rows, x[j]);
                    }
                }
            }
        }
    }
}

}  // namespace

int64_t lm_head_scratch_bf16(int64_t N, int64_t V) { return std::min(N, kDwRows) * V; }

double lm_head_cross_entropy_bf16(const uint16_t* h, const uint16_t* W, const int32_t* targets,
                                  int64_t N, int64_t C, int64_t V, float grad_scale, float* dh,
                                  float* dW, int64_t* valid, float* scratch, int64_t scratch_floats,
                                  uint16_t* scratch_bf16) {
    const int64_t rows = std::min(N, kRows);
    const int64_t ld = std::min(N, kDwRows);  // columns of the transposed logit gradients
    APIARY_CHECK(scratch_floats >= rows * V,
                 "lm_head_cross_entropy_bf16: scratch of {} floats, needs {}", scratch_floats,
                 rows * V);
    double loss_sum = 0.0;
    int64_t count = 0;
    std::vector<float> lse(static_cast<size_t>(rows)), factor(static_cast<size_t>(rows));
    int64_t pending = 0;  // rows whose gradients in scratch_bf16 are not yet in dW
    for (int64_t r0 = 0; r0 < N; r0 += rows) {
        const int64_t rn = std::min(rows, N - r0);
        float* logits = scratch;
        {
            APIARY_PROFILE("head: logits gemm");
            gemm_bf16(false, true, rn, V, C, h + r0 * C, C, W, C, 0.0f, logits, V);
        }
        {
            APIARY_PROFILE("head: softmax");
            row_statistics(logits, targets + r0, rn, V, grad_scale, lse.data(), factor.data(),
                           &loss_sum, &count);
        }
        if (!dh) continue;
        // The logit gradients go back through bf16 matmuls like any other.
        uint16_t* dl_t = scratch_bf16 + pending;  // (V, rn) at leading dimension ld
        {
            APIARY_PROFILE("head: gradient to bf16");
            gradient_transposed(logits, targets + r0, lse.data(), factor.data(), rn, V, dl_t, ld);
        }
        {
            APIARY_PROFILE("head: dh gemm");
            gemm_bf16(true, false, rn, C, V, dl_t, ld, W, C, 0.0f, dh + r0 * C, C);
        }
        pending += rn;
        if (pending + rows > ld || r0 + rn == N) {
            APIARY_PROFILE("head: dW gemm");
            // In vocabulary chunks: oneDNN runs this GEMM 25% faster as
            // 16384-row pieces than as one (V, C) product (measured, 1 and
            // 2 threads).
            const uint16_t* h_rows = h + (r0 + rn - pending) * C;
            for (int64_t v0 = 0; v0 < V; v0 += kDwVocabChunk) {
                gemm_bf16(false, false, std::min(kDwVocabChunk, V - v0), C, pending,
                          scratch_bf16 + v0 * ld, ld, h_rows, C, 1.0f, dW + v0 * C, C);
            }
            pending = 0;
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
