// bf16 training's elementwise kernels that produce a matmul operand: they
// write it in bf16 directly. The fp32 value the fp32 kernels write is, in
// bf16 training, only ever read by to_bf16 (and, for a gradient, by the
// bias's column sums), so each of these saves a write and a read of an fp32
// activation and a parallel region. Same formulas as elementwise.cc (GELU
// through simd::exp, which mirrors fast_exp); the layernorm's row sums are
// vectorised, so its statistics differ from the fp32 kernel's in rounding.

// GCC 12 warns inside its own AVX-512 intrinsics (a known false positive on
// the unused upper half of a mask register), as in matmul_bf16.cc.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/omp_util.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/cpu/simd.h"
#include "kernels/kernels.h"

namespace apiary::kernels {

using namespace simd;  // NOLINT: the 16-lane vocabulary of these kernels

namespace {



constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)

// fast_tanh(x) = 1 - 2 / (exp(2x) + 1) on 16 lanes.
Vf tanh16(Vf x) {
    const Vf e = simd::exp(mul(set1(2.0f), x));
    return sub(set1(1.0f), div(set1(2.0f), add(e, set1(1.0f))));
}

// u = sqrt(2/pi) (v + 0.044715 v^3), as gelu_forward computes it.
Vf gelu_arg(Vf v) {
    const Vf v3 = mul(mul(mul(set1(0.044715f), v), v), v);
    return mul(set1(kGeluScale), add(v, v3));
}

Vf gelu16(Vf v) {
    const Vf half_v = mul(set1(0.5f), v);
    return mul(half_v, add(set1(1.0f), tanh16(gelu_arg(v))));
}

// d gelu / dv, as gelu_backward computes it.
Vf gelu_grad16(Vf v) {
    const Vf th = tanh16(gelu_arg(v));
    const Vf sech2 = sub(set1(1.0f), mul(th, th));
    const Vf du = mul(
        set1(kGeluScale),
        add(set1(1.0f), mul(mul(set1(3.0f * 0.044715f), v), v)));
    const Vf a = mul(set1(0.5f), add(set1(1.0f), th));
    const Vf b = mul(mul(mul(set1(0.5f), v), sech2), du);
    return add(a, b);
}

}  // namespace

void gelu_forward_bf16(uint16_t* out, const float* x, int64_t n) {
#pragma omp parallel for schedule(static)
    for (int64_t i0 = 0; i0 < n; i0 += 4096) {
        const int64_t i1 = std::min(n, i0 + 4096);
        int64_t i = i0;
        for (; i + 16 <= i1; i += 16) store_bf16(out + i, gelu16(loadu(x + i)));
        if (i < i1) {
            const Mask m = first_lanes(i1 - i);
            mask_store_bf16(out + i, m, gelu16(maskz_loadu(m, x + i)));
        }
    }
}

namespace {

// The (N, W) pass behind gelu_backward_bf16 and to_bf16_column_sums: value(at,
// mask) gives the 16 fp32 values at flat offset at (masked lanes zero); they
// go to dst in bf16 and, if col_sums, into its column sums. Each thread owns
// a contiguous range of columns and walks the rows in order, so a column is
// summed from zero row by row, then added to col_sums: linear_bias_backward's
// order, bit for bit. (Thread-owned 64-column blocks instead walk the rows
// with a stride of W floats, a new page per row, and ran 3x slower.) Full
// vectors load and store unmasked: masked accesses in the main loop are 2x
// slower on this machine.
template <typename Value>
void rows_to_bf16(uint16_t* dst, float* col_sums, int64_t N, int64_t W, Value&& value) {
#pragma omp parallel
    {
        const int64_t nt = omp_get_num_threads_safe(), tid = omp_get_thread_num_safe();
        const int64_t vectors = (W + 15) / 16;
        const int64_t j0 = 16 * (vectors * tid / nt);
        const int64_t j1 = std::min(W, 16 * (vectors * (tid + 1) / nt));
        std::vector<float> acc(size_t(std::max<int64_t>(0, j1 - j0)), 0.0f);
        const int64_t full = j0 + (j1 - j0) / 16 * 16;
        for (int64_t i = 0; i < N; ++i) {
            for (int64_t j = j0; j < full; j += 16) {
                const Vf x = value(i * W + j, Mask(0xFFFF));
                float* a = acc.data() + (j - j0);
                storeu(a, add(loadu(a), x));
                store_bf16(dst + i * W + j, x);
            }
            if (full < j1) {
                const Mask m = first_lanes(j1 - full);
                const Vf x = value(i * W + full, m);
                float* a = acc.data() + (full - j0);
                mask_storeu(a, m, add(maskz_loadu(m, a), x));
                mask_store_bf16(dst + i * W + full, m, x);
            }
        }
        if (col_sums) {
            for (int64_t j = j0; j < j1; ++j) col_sums[j] += acc[size_t(j - j0)];
        }
    }
}

// Loads 16 floats at p: unmasked when every lane is live.
Vf load16(const float* p, Mask m) {
    return m == 0xFFFF ? loadu(p) : maskz_loadu(m, p);
}

}  // namespace

void gelu_backward_bf16(uint16_t* dx, float* col_sums, const float* x, const float* dout, int64_t N,
                        int64_t W) {
    rows_to_bf16(dx, col_sums, N, W, [&](int64_t at, Mask m) {
        return mul(load16(dout + at, m), gelu_grad16(load16(x + at, m)));
    });
}

void to_bf16_column_sums(uint16_t* dst, float* col_sums, const float* src, int64_t N, int64_t W) {
    rows_to_bf16(dst, col_sums, N, W, [&](int64_t at, Mask m) { return load16(src + at, m); });
}

void layernorm_forward_bf16(uint16_t* out, float* mean, float* rstd, const float* x,
                            const float* weight, const float* bias, int64_t N, int64_t C,
                            float eps) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; ++i) {
        const float* xi = x + i * C;
        Vf s = zero();
        for (int64_t c = 0; c < C; c += 16)
            s = add(s, load16(xi + c, first_lanes(C - c)));
        const float m = reduce_add(s) / float(C);
        Vf var = zero();
        for (int64_t c = 0; c < C; c += 16) {
            const Mask k = first_lanes(C - c);
            const Vf d = maskz_sub(k, load16(xi + c, k), set1(m));
            var = add(var, mul(d, d));
        }
        const float r = 1.0f / std::sqrt(reduce_add(var) / float(C) + eps);
        for (int64_t c = 0; c < C; c += 16) {
            const Mask k = first_lanes(C - c);
            const Vf d = sub(load16(xi + c, k), set1(m));
            const Vf y =
                add(mul(mul(d, set1(r)), load16(weight + c, k)),
                              load16(bias + c, k));
            if (k == 0xFFFF) {
                store_bf16(out + i * C + c, y);
            } else {
                mask_store_bf16(out + i * C + c, k, y);
            }
        }
        mean[i] = m;
        rstd[i] = r;
    }
}

}  // namespace apiary::kernels
