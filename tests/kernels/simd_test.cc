// The 16-lane layer under the hand-vectorised kernels, on whichever back end
// this build has (AVX-512 or generic vectors): each operation against the
// scalar rule it stands for, masks that never touch a dead lane's memory.

#include "kernels/cpu/simd.h"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/tensor.h"
#include "kernels/cpu/vec_math.h"

namespace apiary::kernels {
namespace {

using namespace simd;

std::array<float, 16> lanes_of(Vf x) {
    std::array<float, 16> out;
    storeu(out.data(), x);
    return out;
}

float from_bits(uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

TEST(Simd, ExpMatchesScalarFastExp) {
    std::array<float, 16> x;
    for (float base : {-100.0f, -87.5f, -20.0f, -1.0f, 0.0f, 3.0f, 87.9f, 200.0f}) {
        for (int i = 0; i < 16; ++i) x[size_t(i)] = base + 0.37f * float(i);
        const auto y = lanes_of(simd::exp(loadu(x.data())));
        for (int i = 0; i < 16; ++i) {
            const float want = detail::fast_exp(x[size_t(i)]);
            // The same polynomial; only fma contraction may differ.
            EXPECT_NEAR(y[size_t(i)], want, 4e-7f * std::abs(want)) << "x = " << x[size_t(i)];
        }
    }
}

TEST(Simd, Bf16RoundsAsCore) {
    // Ties to even both ways, carries into the exponent, infinities, a NaN
    // whose quiet bit is clear, the largest finite value, denormals.
    const uint32_t bits[16] = {0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x3f7fffffu,
                               0x7f800000u, 0xff800000u, 0x7f800001u, 0x7f7fffffu,
                               0x00000001u, 0x80400000u, 0x40490fdbu, 0xc2f6e979u,
                               0x00000000u, 0x80000000u, 0x477fe000u, 0x3eaaaaabu};
    float x[16];
    for (int i = 0; i < 16; ++i) x[i] = from_bits(bits[i]);
    uint16_t got[16];
    store_bf16(got, loadu(x));
    for (int i = 0; i < 16; ++i) {
        if (i == 8 || i == 9) continue;  // denormals: vcvtneps2bf16 flushes them
        EXPECT_EQ(got[i], core::f32_to_bf16(x[i])) << "lane " << i << " bits " << bits[i];
    }
    EXPECT_EQ(got[6] & 0x7fc0u, 0x7fc0u) << "a NaN stays a quiet NaN";
}

TEST(Simd, MaskedAccessLeavesDeadLanesAlone) {
    for (int n = 0; n <= 16; ++n) {
        float src[16], dst[16];
        uint16_t dst16[16];
        for (int i = 0; i < 16; ++i) {
            src[i] = float(i + 1);
            dst[i] = -1.0f;
            dst16[i] = 0xbeef;
        }
        const Mask m = first_lanes(n);
        const auto loaded = lanes_of(maskz_loadu(m, src));
        mask_storeu(dst, m, set1(7.0f));
        mask_store_bf16(dst16, m, set1(1.0f));
        for (int i = 0; i < 16; ++i) {
            EXPECT_EQ(loaded[size_t(i)], i < n ? src[i] : 0.0f) << n << " live, lane " << i;
            EXPECT_EQ(dst[i], i < n ? 7.0f : -1.0f) << n << " live, lane " << i;
            EXPECT_EQ(dst16[i], i < n ? 0x3f80u : 0xbeefu) << n << " live, lane " << i;
        }
    }
    const auto kept = lanes_of(mask_loadu(set1(-5.0f), first_lanes(3), std::array<float, 16>{1, 2, 3}.data()));
    EXPECT_EQ(kept[2], 3.0f);
    EXPECT_EQ(kept[3], -5.0f);
}

TEST(Simd, MaskedArithmeticAndReductions) {
    float a[16], b[16];
    for (int i = 0; i < 16; ++i) {
        a[i] = float(i) - 4.5f;
        b[i] = 2.0f;
    }
    const Mask odd = 0xAAAA;
    const auto sub_odd = lanes_of(mask_sub(loadu(a), odd, loadu(a), loadu(b)));
    const auto mul_z = lanes_of(maskz_sub(first_lanes(5), loadu(a), loadu(b)));
    const auto mov = lanes_of(maskz_mov(first_lanes(2), loadu(a)));
    for (int i = 0; i < 16; ++i) {
        EXPECT_EQ(sub_odd[size_t(i)], i % 2 ? a[i] - 2.0f : a[i]);
        EXPECT_EQ(mul_z[size_t(i)], i < 5 ? a[i] - 2.0f : 0.0f);
        EXPECT_EQ(mov[size_t(i)], i < 2 ? a[i] : 0.0f);
    }
    EXPECT_FLOAT_EQ(reduce_add(loadu(a)), 16.0f * 7.5f - 16.0f * 4.5f);
    EXPECT_EQ(reduce_max(loadu(a)), 10.5f);
    EXPECT_EQ(lanes_of(min(loadu(a), set1(0.0f)))[15], 0.0f);
}

TEST(Simd, Transpose16) {
    Vf r[16];
    for (int i = 0; i < 16; ++i) {
        float row[16];
        for (int j = 0; j < 16; ++j) row[j] = float(16 * i + j);
        r[i] = loadu(row);
    }
    transpose16(r);
    for (int i = 0; i < 16; ++i) {
        const auto col = lanes_of(r[i]);
        for (int j = 0; j < 16; ++j) EXPECT_EQ(col[size_t(j)], float(16 * j + i));
    }
}

TEST(Simd, Bf16PairDotProduct) {
    // Lane i: (lo, hi) pairs of a and b; exact in fp32 for these values.
    uint32_t a[16], b[16];
    float want[16];
    for (int i = 0; i < 16; ++i) {
        const float alo = float(i) * 0.5f, ahi = 3.0f - float(i), blo = 2.0f, bhi = -0.25f * float(i);
        a[i] = uint32_t(core::f32_to_bf16(alo)) | uint32_t(core::f32_to_bf16(ahi)) << 16;
        b[i] = uint32_t(core::f32_to_bf16(blo)) | uint32_t(core::f32_to_bf16(bhi)) << 16;
        want[i] = 1.0f + alo * blo + ahi * bhi;
    }
    const auto got = lanes_of(dot_bf16_pairs(set1(1.0f), loadu_i(a), loadu_i(b)));
    for (int i = 0; i < 16; ++i) EXPECT_EQ(got[size_t(i)], want[i]) << "lane " << i;
    const uint16_t y[3] = {core::f32_to_bf16(1.5f), core::f32_to_bf16(-2.0f), 0x4040};
    const auto widened = lanes_of(maskz_load_bf16(first_lanes(3), y));
    EXPECT_EQ(widened[0], 1.5f);
    EXPECT_EQ(widened[1], -2.0f);
    EXPECT_EQ(widened[2], 3.0f);
    EXPECT_EQ(widened[3], 0.0f);
}

}  // namespace
}  // namespace apiary::kernels
