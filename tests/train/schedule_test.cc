#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "optim/adamw.h"
#include "train/schedule.h"

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

namespace {

apiary::train::LrSchedule schedule(bool by_tokens, int64_t varying,
                                   std::function<int64_t(int64_t)> tokens_of) {
    return apiary::train::LrSchedule(100, 10, 1.0, 0.1, by_tokens, varying, tokens_of);
}

}  // namespace

TEST(LrSchedule, TokenClockEqualsStepClockWhenEveryStepIsAlike) {
    const auto steps = schedule(false, 0, [](int64_t) { return 4096; });
    const auto tokens = schedule(true, 0, [](int64_t) { return 4096; });
    for (int64_t s = 0; s <= 101; ++s) {
        EXPECT_DOUBLE_EQ(tokens.at(s), steps.at(s)) << s;
        EXPECT_DOUBLE_EQ(steps.at(s), lr_schedule(s, 100, 10, 1.0, 0.1)) << s;
    }
    EXPECT_EQ(tokens.tokens_before(100), 409600);
}

TEST(LrSchedule, TokenClockFollowsAGrowingBatch) {
    // A batch-mode curriculum: steps 0-19 train on 100 + 20 s tokens, then 500.
    auto tok = [](int64_t s) { return s < 20 ? 100 + 20 * s : 500; };
    const auto by_tokens = schedule(true, 20, tok);
    int64_t sum = 0;
    for (int64_t s = 0; s < 30; ++s) {
        EXPECT_EQ(by_tokens.tokens_before(s), sum) << s;
        sum += tok(s);
    }
    // Warmup: 10 full steps = 5000 tokens; steps 0-17 hold 4860, so the
    // ramp (tokens after the step / 5000) peaks during step 18.
    EXPECT_EQ(by_tokens.tokens_before(18), 4860);
    for (int64_t s = 0; s < 18; ++s) {
        EXPECT_DOUBLE_EQ(by_tokens.at(s), double(by_tokens.tokens_before(s + 1)) / 5000.0) << s;
        EXPECT_LT(by_tokens.at(s), by_tokens.at(s + 1)) << s;
    }
    EXPECT_DOUBLE_EQ(by_tokens.at(18), 1.0);
    // Then a cosine over tokens to min at the end of the 45800, never rising.
    EXPECT_EQ(by_tokens.tokens_before(100), 5800 + 80 * 500);
    for (int64_t s = 18; s < 100; ++s) EXPECT_GE(by_tokens.at(s), by_tokens.at(s + 1)) << s;
    const double progress = (5800.0 + 41 * 500 - 5000) / (45800 - 5000);
    EXPECT_NEAR(by_tokens.at(61), 0.1 + 0.45 * (1 + std::cos(M_PI * progress)), 1e-12);
    EXPECT_DOUBLE_EQ(by_tokens.at(100), 0.1);
    // The step clock would have peaked at step 9, on fewer tokens.
    EXPECT_DOUBLE_EQ(schedule(false, 20, tok).at(9), 1.0);
    EXPECT_LT(by_tokens.at(9), 0.5);
}
