// The dynamic loss scaler's state machine: skip and back off on overflow,
// grow after an interval of clean steps, stop loudly below the minimum.

#include <gtest/gtest.h>

#include "core/error.h"
#include "optim/loss_scaler.h"

using apiary::optim::LossScaler;
using apiary::optim::LossScalerOptions;

TEST(LossScaler, OverflowSkipsAndBacksOff) {
    LossScaler s({1024.0, 2.0, 0.5, 3, 1.0});
    EXPECT_FALSE(s.update(true, 1));
    EXPECT_EQ(s.scale(), 512.0);
    EXPECT_EQ(s.skipped_steps(), 1);
    EXPECT_EQ(s.overflows(), 1);
}

TEST(LossScaler, GrowsAfterIntervalOfCleanSteps) {
    LossScaler s({1024.0, 2.0, 0.5, 3, 1.0});
    EXPECT_TRUE(s.update(false, 1));
    EXPECT_TRUE(s.update(false, 2));
    EXPECT_EQ(s.scale(), 1024.0);
    EXPECT_TRUE(s.update(false, 3));
    EXPECT_EQ(s.scale(), 2048.0);
    EXPECT_EQ(s.growths(), 1);
    EXPECT_EQ(s.clean_streak(), 0);
}

TEST(LossScaler, OverflowResetsTheCleanStreak) {
    LossScaler s({1024.0, 2.0, 0.5, 3, 1.0});
    s.update(false, 1);
    s.update(false, 2);
    s.update(true, 3);  // 512, streak reset
    s.update(false, 4);
    s.update(false, 5);
    EXPECT_EQ(s.scale(), 512.0);
    s.update(false, 6);
    EXPECT_EQ(s.scale(), 1024.0);
}

TEST(LossScaler, StopsBelowMinimumScale) {
    LossScaler s({4.0, 2.0, 0.5, 1000, 1.0});
    EXPECT_FALSE(s.update(true, 1));  // 2
    EXPECT_FALSE(s.update(true, 2));  // 1
    try {
        s.update(true, 3);  // 0.5 < 1
        FAIL() << "expected the scaler to stop the run";
    } catch (const apiary::Error& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find("loss scale fell to 0.5"), std::string::npos) << m;
        EXPECT_NE(m.find("at step 3 after 3 overflowing steps"), std::string::npos) << m;
    }
}

TEST(LossScaler, DisabledIsUnitScaleAndNeverSkipsCleanSteps) {
    LossScaler s({1024.0, 2.0, 0.5, 1, 1.0}, false);
    EXPECT_EQ(s.scale(), 1.0);
    EXPECT_TRUE(s.update(false, 1));
    EXPECT_EQ(s.scale(), 1.0);
}

TEST(LossScaler, StateRoundTrips) {
    LossScaler a({1024.0, 2.0, 0.5, 2, 1.0});
    a.update(true, 1);
    a.update(false, 2);
    LossScaler b({1.0, 2.0, 0.5, 2, 1.0});
    b.restore(a.state());
    EXPECT_EQ(b.scale(), a.scale());
    EXPECT_EQ(b.skipped_steps(), 1);
    EXPECT_EQ(b.clean_streak(), 1);
    b.update(false, 3);
    EXPECT_EQ(b.scale(), 1024.0);
}
