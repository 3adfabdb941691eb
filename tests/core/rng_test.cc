#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "core/rng.h"

using namespace apiary::core;

// Known-answer test from the Random123 distribution (kat_vectors):
// philox4x32 10 rounds, counter 0, key 0.
TEST(Philox, KnownAnswerZero) {
    const auto r = philox4x32({0, 0, 0, 0}, {0, 0});
    EXPECT_EQ(r[0], 0x6627e8d5u);
    EXPECT_EQ(r[1], 0xe169c58du);
    EXPECT_EQ(r[2], 0xbc57ac4cu);
    EXPECT_EQ(r[3], 0x9b00dbd8u);
}

// Random123 kat_vectors: counter all 0xffffffff, key all 0xffffffff.
TEST(Philox, KnownAnswerOnes) {
    const auto r = philox4x32({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
                              {0xffffffffu, 0xffffffffu});
    EXPECT_EQ(r[0], 0x408f276du);
    EXPECT_EQ(r[1], 0x41c83b0eu);
    EXPECT_EQ(r[2], 0xa20bc7c6u);
    EXPECT_EQ(r[3], 0x6d5451fdu);
}

TEST(Philox, RandomAccessEqualsSequential) {
    Philox p(42, 7);
    RngStream s(42, 7);
    for (uint64_t i = 0; i < 100; ++i) EXPECT_EQ(p.uniform(i), s.uniform());
}

TEST(Philox, StreamsDiffer) {
    Philox a(1, 0), b(1, 1), c(2, 0);
    EXPECT_NE(a.u32(0), b.u32(0));
    EXPECT_NE(a.u32(0), c.u32(0));
}

TEST(Philox, NormalMoments) {
    Philox p(3, 0);
    double sum = 0, sq = 0;
    const int n = 200000;
    for (int i = 0; i < n; ++i) {
        const double x = p.normal(i);
        sum += x;
        sq += x * x;
    }
    EXPECT_NEAR(sum / n, 0.0, 0.01);
    EXPECT_NEAR(sq / n, 1.0, 0.01);
}

TEST(Philox, BelowIsInRangeAndCoversIt) {
    Philox p(5, 0);
    std::set<uint64_t> seen;
    for (uint64_t i = 0; i < 1000; ++i) {
        const uint64_t v = p.below(i, 7);
        ASSERT_LT(v, 7u);
        seen.insert(v);
    }
    EXPECT_EQ(seen.size(), 7u);
}
