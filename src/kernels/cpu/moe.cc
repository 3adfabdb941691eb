// Mixture-of-experts routing, dispatch and combine (declared in
// kernels/kernels.h). The experts' matmuls are plain gemm calls, one per
// expert over its contiguous rows of the expert-ordered buffer; everything
// here is memory-bound bookkeeping around them. The admission of choices
// under a capacity is sequential (its order is the definition of which
// choices drop); every other loop is parallel over tokens, each token
// writing only its own outputs, so results do not depend on the threads.

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/omp_util.h"
#include "kernels/kernels.h"

namespace apiary::kernels {

int64_t moe_capacity(int64_t N, int64_t E, int64_t K, double capacity_factor, bool dropless) {
    APIARY_CHECK(N >= 0 && E >= 1 && K >= 1 && K <= E, "moe_capacity: N={} E={} K={}", N, E, K);
    if (dropless) return N;
    APIARY_CHECK(capacity_factor > 0, "moe_capacity: capacity factor {} must be > 0",
                 capacity_factor);
    const double c = std::ceil(capacity_factor * double(N) * double(K) / double(E));
    return std::min<int64_t>(N, std::max<int64_t>(1, int64_t(c)));
}

namespace {

// log(sum(exp(row))) of E values, in double.
double logsumexp(const float* row, int64_t E) {
    float m = row[0];
    for (int64_t e = 1; e < E; ++e) m = std::max(m, row[e]);
    double s = 0;
    for (int64_t e = 0; e < E; ++e) s += std::exp(double(row[e]) - double(m));
    return double(m) + std::log(s);
}

}  // namespace

MoeLosses moe_route_forward(const MoeRouteOut& out, const float* logits, const float* bias,
                            int64_t N, int64_t E, int64_t K, MoeRouter router, int64_t capacity) {
    APIARY_CHECK(E >= 1 && K >= 1 && K <= E && N >= 0, "moe routing: N={} E={} K={}", N, E, K);
    APIARY_CHECK(capacity >= 0, "moe routing: capacity {}", capacity);
    APIARY_CHECK(N * K < (int64_t(1) << 31), "moe routing: N K = {} rows exceed int32 slots",
                 N * K);
    const bool sigmoid = router == MoeRouter::sigmoid;
    double zsum = 0;
#pragma omp parallel for schedule(static) reduction(+ : zsum)
    for (int64_t t = 0; t < N; ++t) {
        const float* l = logits + t * E;
        float* p = out.probs + t * E;
        const double lse = logsumexp(l, E);
        zsum += lse * lse;
        for (int64_t e = 0; e < E; ++e) {
            p[e] = sigmoid ? float(1.0 / (1.0 + std::exp(-double(l[e]))))
                           : float(std::exp(double(l[e]) - lse));
        }
        // Top-K by strict comparison in ascending expert order: a tie keeps
        // the lower index. Softmax compares logits (the same order as the
        // probabilities, without rounding ties into them).
        int32_t* chosen = out.expert + t * K;
        for (int64_t j = 0; j < K; ++j) {
            int32_t best = -1;
            float best_score = 0;
            for (int64_t e = 0; e < E; ++e) {
                bool taken = false;
                for (int64_t i = 0; i < j; ++i) taken = taken || chosen[i] == int32_t(e);
                if (taken) continue;
                const float score = sigmoid ? p[e] + (bias ? bias[e] : 0.0f) : l[e];
                if (best < 0 || score > best_score) {
                    best = int32_t(e);
                    best_score = score;
                }
            }
            chosen[j] = best;
        }
        float* g = out.gate + t * K;
        double sum = 0;
        for (int64_t j = 0; j < K; ++j) sum += p[chosen[j]];
        for (int64_t j = 0; j < K; ++j) {
            g[j] = K == 1 ? p[chosen[j]] : float(double(p[chosen[j]]) / sum);
        }
    }
    // Admission: first choices of every token, then second choices, ...
    std::vector<int64_t> count(size_t(E), 0);
    std::fill_n(out.routed, E, 0);
    std::fill_n(out.dropped, E, 0);
    for (int64_t j = 0; j < K; ++j) {
        for (int64_t t = 0; t < N; ++t) {
            const int32_t e = out.expert[t * K + j];
            out.routed[e] += 1;
            if (count[size_t(e)] < capacity) {
                out.slot[t * K + j] = int32_t(count[size_t(e)]++);
            } else {
                out.slot[t * K + j] = -1;
                out.gate[t * K + j] = 0.0f;
                out.dropped[e] += 1;
            }
        }
    }
    out.offsets[0] = 0;
    for (int64_t e = 0; e < E; ++e) out.offsets[e + 1] = out.offsets[e] + count[size_t(e)];
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < N; ++t) {
        for (int64_t j = 0; j < K; ++j) {
            int32_t& s = out.slot[t * K + j];
            if (s < 0) continue;
            s = int32_t(out.offsets[out.expert[t * K + j]] + s);
            out.token_of[s] = int32_t(t);
        }
    }
    // The balance loss: E sum_e f_e P_e.
    MoeLosses losses;
    if (N == 0) return losses;
    std::vector<double> P(size_t(E), 0.0);
    for (int64_t t = 0; t < N; ++t) {
        const float* p = out.probs + t * E;
        double norm = 1.0;
        if (sigmoid) {
            norm = 0;
            for (int64_t e = 0; e < E; ++e) norm += p[e];
        }
        for (int64_t e = 0; e < E; ++e) P[size_t(e)] += double(p[e]) / norm;
    }
    for (int64_t e = 0; e < E; ++e) {
        const double f = double(out.routed[e]) / double(N * K);
        losses.aux += double(E) * f * P[size_t(e)] / double(N);
    }
    losses.z = zsum / double(N);
    return losses;
}

void moe_route_backward(float* dlogits, const float* dgate, const float* logits,
                        const float* probs, const int32_t* expert, const int64_t* routed,
                        int64_t N, int64_t E, int64_t K, MoeRouter router, float aux_coef,
                        float z_coef) {
    if (N == 0) return;
    const bool sigmoid = router == MoeRouter::sigmoid;
    // d(aux_coef aux) / dP_e = aux_coef E f_e, and P_e is a mean over N tokens.
    std::vector<double> aux_grad(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) {
        aux_grad[size_t(e)] = double(aux_coef) * double(E) * double(routed[e]) /
                              double(N * K) / double(N);
    }
#pragma omp parallel
    {
        std::vector<double> ds(static_cast<size_t>(E));
#pragma omp for schedule(static)
        for (int64_t t = 0; t < N; ++t) {
            const float* p = probs + t * E;
            const float* l = logits + t * E;
            const int32_t* chosen = expert + t * K;
            const float* dg = dgate + t * K;
            std::fill(ds.begin(), ds.end(), 0.0);
            // Through the gates to the chosen scores.
            if (K == 1) {
                ds[size_t(chosen[0])] += dg[0];
            } else {
                double sum = 0, dot = 0;
                for (int64_t j = 0; j < K; ++j) sum += p[chosen[j]];
                for (int64_t j = 0; j < K; ++j) dot += double(dg[j]) * double(p[chosen[j]]) / sum;
                for (int64_t j = 0; j < K; ++j) ds[size_t(chosen[j])] += (dg[j] - dot) / sum;
            }
            float* dl = dlogits + t * E;
            if (!sigmoid) {
                for (int64_t e = 0; e < E; ++e) ds[size_t(e)] += aux_grad[size_t(e)];
                double pds = 0;
                for (int64_t e = 0; e < E; ++e) pds += double(p[e]) * ds[size_t(e)];
                for (int64_t e = 0; e < E; ++e) dl[e] = float(double(p[e]) * (ds[size_t(e)] - pds));
            } else {
                // P uses the scores normalised per token: q = s / sum(s).
                double sum = 0, dq_q = 0;
                for (int64_t e = 0; e < E; ++e) sum += p[e];
                for (int64_t e = 0; e < E; ++e) dq_q += aux_grad[size_t(e)] * double(p[e]) / sum;
                for (int64_t e = 0; e < E; ++e) {
                    const double d = ds[size_t(e)] + (aux_grad[size_t(e)] - dq_q) / sum;
                    dl[e] = float(d * double(p[e]) * (1.0 - double(p[e])));
                }
            }
            if (z_coef != 0.0f) {
                // d(lse^2 / N) / dl = 2 lse softmax(l) / N.
                const double lse = logsumexp(l, E);
                const double c = double(z_coef) * 2.0 * lse / double(N);
                for (int64_t e = 0; e < E; ++e) {
                    dl[e] += float(c * std::exp(double(l[e]) - lse));
                }
            }
        }
    }
}

void moe_gather(float* xg, const float* x, const int32_t* token_of, int64_t M, int64_t C) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < M; ++r) std::copy_n(x + int64_t(token_of[r]) * C, C, xg + r * C);
}

void moe_gather_backward(float* dx, const float* dxg, const int32_t* slot, int64_t N, int64_t K,
                         int64_t C) {
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < N; ++t) {
        float* d = dx + t * C;
        for (int64_t j = 0; j < K; ++j) {
            const int32_t s = slot[t * K + j];
            if (s < 0) continue;
            const float* src = dxg + int64_t(s) * C;
            for (int64_t c = 0; c < C; ++c) d[c] += src[c];
        }
    }
}

void moe_combine_forward(float* y, const float* ye, const int32_t* slot, const float* gate,
                         int64_t N, int64_t K, int64_t C) {
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < N; ++t) {
        float* o = y + t * C;
        for (int64_t j = 0; j < K; ++j) {
            const int32_t s = slot[t * K + j];
            if (s < 0) continue;
            const float g = gate[t * K + j];
            const float* src = ye + int64_t(s) * C;
            for (int64_t c = 0; c < C; ++c) o[c] += g * src[c];
        }
    }
}

void moe_combine_backward(float* dye, float* dgate, const float* dy, const float* ye,
                          const int32_t* slot, const float* gate, int64_t N, int64_t K,
                          int64_t C) {
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < N; ++t) {
        const float* d = dy + t * C;
        for (int64_t j = 0; j < K; ++j) {
            const int32_t s = slot[t * K + j];
            if (s < 0) {
                dgate[t * K + j] = 0.0f;
                continue;
            }
            const float g = gate[t * K + j];
            const float* src = ye + int64_t(s) * C;
            float* dst = dye + int64_t(s) * C;
            double dot = 0;
            for (int64_t c = 0; c < C; ++c) {
                dst[c] = g * d[c];
                dot += double(d[c]) * double(src[c]);
            }
            dgate[t * K + j] = float(dot);
        }
    }
}

namespace {

// Whether to run the experts' gemms side by side, one thread each (a gemm
// inside a parallel region runs single-threaded), instead of one after the
// other with every thread in each. Side by side when there are at least
// two experts per thread and the average expert's gemm is small: then one
// parallel region replaces E of them (each a barrier, costly on a loaded
// machine) and small gemms lose little by running on one thread.
bool experts_side_by_side(const int64_t* offsets, int64_t E, int64_t IN, int64_t OUT) {
    const int threads = omp_get_max_threads_safe();
    if (threads < 2 || E < 2 * threads) return false;
    const double flops_per_expert = 2.0 * double(offsets[E]) * double(IN * OUT) / double(E);
    return flops_per_expert < 2e8;
}

}  // namespace

void grouped_linear_forward(float* y, const float* x, const float* const* W,
                            const int64_t* offsets, int64_t E, int64_t IN, int64_t OUT) {
    const bool side_by_side = experts_side_by_side(offsets, E, IN, OUT);
#pragma omp parallel for schedule(dynamic, 1) if (side_by_side)
    for (int64_t e = 0; e < E; ++e) {
        const int64_t r0 = offsets[e], rows = offsets[e + 1] - offsets[e];
        if (rows == 0) continue;
        gemm(false, true, rows, OUT, IN, x + r0 * IN, IN, W[e], IN, 0.0f, y + r0 * OUT, OUT);
    }
}

void grouped_linear_backward(float* dx, float* const* dW, const float* dy, const float* x,
                             const float* const* W, const int64_t* offsets, int64_t E,
                             int64_t IN, int64_t OUT) {
    const bool side_by_side = experts_side_by_side(offsets, E, IN, OUT);
#pragma omp parallel for schedule(dynamic, 1) if (side_by_side)
    for (int64_t e = 0; e < E; ++e) {
        const int64_t r0 = offsets[e], rows = offsets[e + 1] - offsets[e];
        if (rows == 0) continue;
        if (dx) {
            gemm(false, false, rows, IN, OUT, dy + r0 * OUT, OUT, W[e], IN, 0.0f, dx + r0 * IN,
                 IN);
        }
        gemm(true, false, OUT, IN, rows, dy + r0 * OUT, OUT, x + r0 * IN, IN, 1.0f, dW[e], IN);
    }
}

}  // namespace apiary::kernels
