#include <gtest/gtest.h>

#include <cmath>

#include "core/allocator.h"
#include "core/tensor.h"

using namespace apiary::core;

TEST(Allocator, AccountsByCategoryWithPeak) {
    const MemStats before = mem_stats();
    const int g = int(MemCategory::grads);
    {
        Tensor a({10, 10}, DType::f32, MemCategory::grads);
        Tensor b({8}, DType::bf16, MemCategory::grads);
        const MemStats mid = mem_stats();
        EXPECT_EQ(mid.current[g] - before.current[g], 400 + 16);
        EXPECT_GE(mid.peak[g], mid.current[g]);
    }
    const MemStats after = mem_stats();
    EXPECT_EQ(after.current[g], before.current[g]);
    EXPECT_GE(after.peak[g] - before.current[g], 416);
}

TEST(Tensor, ZeroFilledAndMovable) {
    Tensor a({3, 5}, DType::f32, MemCategory::activations);
    for (int64_t i = 0; i < a.numel(); ++i) EXPECT_EQ(a.f32()[i], 0.0f);
    a.f32()[4] = 2.5f;
    Tensor b = std::move(a);
    EXPECT_TRUE(a.empty());
    EXPECT_EQ(b.f32()[4], 2.5f);
    EXPECT_EQ(b.shape_string(), "(3, 5)");
}

TEST(Bf16, RoundsToNearestEven) {
    EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
    EXPECT_EQ(bf16_to_f32(f32_to_bf16(3.140625f)), 3.140625f);
    // 1 + 2^-8 is exactly between two bf16 values: ties to even (1.0).
    EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 1.0f / 256)), 1.0f);
    EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
}

TEST(F16, RoundTripsAndOverflows) {
    for (float x : {0.0f, 1.0f, -2.5f, 65504.0f, 6.1035156e-05f, 5.9604645e-08f}) {
        EXPECT_EQ(f16_to_f32(f32_to_f16(x)), x) << x;
    }
    EXPECT_TRUE(std::isinf(f16_to_f32(f32_to_f16(70000.0f))));
    EXPECT_EQ(f16_to_f32(f32_to_f16(1.0f + 1.0f / 4096)), 1.0f);
}
