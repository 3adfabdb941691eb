// The median benchmarks report: the middle value, the mean of the middle two
// for an even count, NaN for none.

#include "core/timing.h"

#include <gtest/gtest.h>

#include <cmath>

using namespace apiary;

TEST(Median, MiddleValueOrMeanOfTheMiddleTwo) {
    EXPECT_EQ(core::median({3.0, 1.0, 2.0}), 2.0);
    EXPECT_EQ(core::median({4.0, 1.0, 3.0, 2.0}), 2.5);
    EXPECT_EQ(core::median({5.0}), 5.0);
    EXPECT_TRUE(std::isnan(core::median({})));
}

TEST(Clock, SecondsSinceCountUp) {
    const auto t0 = core::Clock::now();
    const double a = core::seconds_since(t0);
    const double b = core::seconds_since(t0);
    EXPECT_GE(a, 0.0);
    EXPECT_GE(b, a);
}
