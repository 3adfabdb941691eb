// Embedding, normalisation, activations and rotary embedding: memory-bound
// loops written so GCC vectorises their inner dimension (AVX-512 or AVX2: whatever the build machine has).

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/omp_util.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/kernels.h"

namespace apiary::kernels {

using detail::fast_exp;
using detail::fast_tanh;

void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                       int64_t B, int64_t T, int64_t C) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < B * T; ++i) {
        const float* e = wte + int64_t(tokens[i]) * C;
        float* o = out + i * C;
        if (wpe) {
            const float* p = wpe + (i % T) * C;
            for (int64_t c = 0; c < C; ++c) o[c] = e[c] + p[c];
        } else {
            for (int64_t c = 0; c < C; ++c) o[c] = e[c];
        }
    }
}

void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                        int64_t B, int64_t T, int64_t C) {
    // Several rows may hit the same token: split the channels across threads
    // instead of the rows, so no two threads write the same element.
#pragma omp parallel
    {
        const int nt = omp_get_num_threads_safe();
        const int tid = omp_get_thread_num_safe();
        const int64_t c0 = C * tid / nt, c1 = C * (tid + 1) / nt;
        for (int64_t i = 0; i < B * T; ++i) {
            float* e = dwte + int64_t(tokens[i]) * C;
            const float* d = dout + i * C;
            for (int64_t c = c0; c < c1; ++c) e[c] += d[c];
            if (dwpe) {
                float* p = dwpe + (i % T) * C;
                for (int64_t c = c0; c < c1; ++c) p[c] += d[c];
            }
        }
    }
}

void layernorm_forward(float* out, float* mean, float* rstd, const float* x, const float* weight,
                       const float* bias, int64_t N, int64_t C, float eps) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; ++i) {
        const float* xi = x + i * C;
        float s = 0.0f;
        for (int64_t c = 0; c < C; ++c) s += xi[c];
        const float m = s / float(C);
        float v = 0.0f;
        for (int64_t c = 0; c < C; ++c) {
            const float d = xi[c] - m;
            v += d * d;
        }
        const float r = 1.0f / std::sqrt(v / float(C) + eps);
        float* o = out + i * C;
        for (int64_t c = 0; c < C; ++c) o[c] = (xi[c] - m) * r * weight[c] + bias[c];
        mean[i] = m;
        rstd[i] = r;
    }
}

void layernorm_backward(float* dx, float* dweight, float* dbias, const float* dout,
                        const float* x, const float* weight, const float* mean, const float* rstd,
                        int64_t N, int64_t C) {
    // dweight/dbias are reduced over rows: each thread sums into its own
    // buffer, then the buffers are added in a fixed order (deterministic).
    const int nthreads = omp_get_max_threads_safe();
    std::vector<float> partial(size_t(nthreads) * 2 * C, 0.0f);
#pragma omp parallel
    {
        const int tid = omp_get_thread_num_safe();
        const int nt = omp_get_num_threads_safe();
        float* pw = partial.data() + size_t(tid) * 2 * C;
        float* pb = pw + C;
        const int64_t r0 = N * tid / nt, r1 = N * (tid + 1) / nt;
        for (int64_t i = r0; i < r1; ++i) {
            const float* xi = x + i * C;
            const float* di = dout + i * C;
            const float m = mean[i], r = rstd[i];
            float sum_g = 0.0f, sum_gx = 0.0f;
            for (int64_t c = 0; c < C; ++c) {
                const float xhat = (xi[c] - m) * r;
                const float g = di[c] * weight[c];
                sum_g += g;
                sum_gx += g * xhat;
                pw[c] += di[c] * xhat;
                pb[c] += di[c];
            }
            sum_g /= float(C);
            sum_gx /= float(C);
            float* dxi = dx + i * C;
            for (int64_t c = 0; c < C; ++c) {
                const float xhat = (xi[c] - m) * r;
                dxi[c] += (di[c] * weight[c] - sum_g - xhat * sum_gx) * r;
            }
        }
    }
    for (int t = 0; t < nthreads; ++t) {
        const float* pw = partial.data() + size_t(t) * 2 * C;
        for (int64_t c = 0; c < C; ++c) {
            dweight[c] += pw[c];
            if (dbias) dbias[c] += pw[C + c];
        }
    }
}

void rmsnorm_forward(float* out, float* rstd, const float* x, const float* weight, int64_t N,
                     int64_t C, float eps) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; ++i) {
        const float* xi = x + i * C;
        float ss = 0.0f;
        for (int64_t c = 0; c < C; ++c) ss += xi[c] * xi[c];
        const float r = 1.0f / std::sqrt(ss / float(C) + eps);
        float* o = out + i * C;
        for (int64_t c = 0; c < C; ++c) o[c] = xi[c] * r * weight[c];
        rstd[i] = r;
    }
}

void rmsnorm_backward(float* dx, float* dweight, const float* dout, const float* x,
                      const float* weight, const float* rstd, int64_t N, int64_t C) {
    const int nthreads = omp_get_max_threads_safe();
    std::vector<float> partial(size_t(nthreads) * C, 0.0f);
#pragma omp parallel
    {
        const int tid = omp_get_thread_num_safe();
        const int nt = omp_get_num_threads_safe();
        float* pw = partial.data() + size_t(tid) * C;
        const int64_t r0 = N * tid / nt, r1 = N * (tid + 1) / nt;
        for (int64_t i = r0; i < r1; ++i) {
            const float* xi = x + i * C;
            const float* di = dout + i * C;
            const float r = rstd[i];
            float sum_gx = 0.0f;
            for (int64_t c = 0; c < C; ++c) {
                sum_gx += di[c] * weight[c] * xi[c];
                pw[c] += di[c] * xi[c] * r;
            }
            const float k = sum_gx * r * r * r / float(C);
            float* dxi = dx + i * C;
            for (int64_t c = 0; c < C; ++c) dxi[c] += di[c] * weight[c] * r - xi[c] * k;
        }
    }
    for (int t = 0; t < nthreads; ++t) {
        const float* pw = partial.data() + size_t(t) * C;
        for (int64_t c = 0; c < C; ++c) dweight[c] += pw[c];
    }
}

namespace {
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
}

void gelu_forward(float* out, const float* x, int64_t n) {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) {
        const float v = x[i];
        const float u = kGeluScale * (v + 0.044715f * v * v * v);
        out[i] = 0.5f * v * (1.0f + fast_tanh(u));
    }
}

void gelu_backward(float* dx, const float* x, const float* dout, int64_t n) {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) {
        const float v = x[i];
        const float u = kGeluScale * (v + 0.044715f * v * v * v);
        const float th = fast_tanh(u);
        const float sech2 = 1.0f - th * th;
        const float du = kGeluScale * (1.0f + 3.0f * 0.044715f * v * v);
        dx[i] = dout[i] * (0.5f * (1.0f + th) + 0.5f * v * sech2 * du);
    }
}

void swiglu_forward(float* out, const float* h, int64_t N, int64_t F) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; ++i) {
        const float* a = h + i * 2 * F;
        const float* b = a + F;
        float* o = out + i * F;
#pragma omp simd
        for (int64_t j = 0; j < F; ++j) {
            const float s = 1.0f / (1.0f + fast_exp(-a[j]));
            o[j] = a[j] * s * b[j];
        }
    }
}

void swiglu_backward(float* dh, const float* dout, const float* h, int64_t N, int64_t F) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; ++i) {
        const float* a = h + i * 2 * F;
        const float* b = a + F;
        const float* d = dout + i * F;
        float* da = dh + i * 2 * F;
        float* db = da + F;
#pragma omp simd
        for (int64_t j = 0; j < F; ++j) {
            const float s = 1.0f / (1.0f + fast_exp(-a[j]));
            const float silu = a[j] * s;
            db[j] = d[j] * silu;
            da[j] = d[j] * b[j] * s * (1.0f + a[j] * (1.0f - s));
        }
    }
}

void rope_tables(float* cos_table, float* sin_table, int64_t max_T, int64_t HS, float theta) {
    const int64_t half = HS / 2;
    for (int64_t t = 0; t < max_T; ++t) {
        for (int64_t i = 0; i < half; ++i) {
            // Angles in double: float powers drift from PyTorch's tables at large t.
            const double freq = 1.0 / std::pow(double(theta), double(2 * i) / double(HS));
            const double angle = double(t) * double(float(freq));
            cos_table[t * half + i] = float(std::cos(angle));
            sin_table[t * half + i] = float(std::sin(angle));
        }
    }
}

void rope_apply(float* x, const float* cos_table, const float* sin_table, int64_t B, int64_t T,
                int64_t row_stride, int64_t offset, int64_t heads, int64_t HS, bool inverse) {
    const int64_t half = HS / 2;
    const float sign = inverse ? -1.0f : 1.0f;
#pragma omp parallel for schedule(static)
    for (int64_t bt = 0; bt < B * T; ++bt) {
        const int64_t t = bt % T;
        const float* cs = cos_table + t * half;
        const float* sn = sin_table + t * half;
        for (int64_t h = 0; h < heads; ++h) {
            float* v = x + bt * row_stride + offset + h * HS;
            for (int64_t i = 0; i < half; ++i) {
                const float a = v[i], b = v[i + half];
                const float s = sign * sn[i];
                v[i] = a * cs[i] - b * s;
                v[i + half] = b * cs[i] + a * s;
            }
        }
    }
}

}  // namespace apiary::kernels
