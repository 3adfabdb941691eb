#include <gtest/gtest.h>

#include <cmath>

#include "optim/adamw.h"

using apiary::optim::lr_schedule;

TEST(LrSchedule, WarmupThenCosineToMin) {
    EXPECT_DOUBLE_EQ(lr_schedule(0, 100, 10, 1.0, 0.1), 0.1);
    EXPECT_DOUBLE_EQ(lr_schedule(9, 100, 10, 1.0, 0.1), 1.0);
    EXPECT_DOUBLE_EQ(lr_schedule(10, 100, 10, 1.0, 0.1), 1.0);
    // Halfway through the decay: the mean of peak and min.
    EXPECT_NEAR(lr_schedule(55, 100, 10, 1.0, 0.1), 0.55, 1e-12);
    EXPECT_DOUBLE_EQ(lr_schedule(100, 100, 10, 1.0, 0.1), 0.1);
    for (int s = 10; s < 99; ++s) EXPECT_GE(lr_schedule(s, 100, 10, 1.0, 0.1), lr_schedule(s + 1, 100, 10, 1.0, 0.1));
}
