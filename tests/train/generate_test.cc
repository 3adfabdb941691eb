// Sampling (train/generate.h) without the binary: greedy, top-k, the seed,
// and the distribution a temperature gives.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "train/generate.h"

namespace apiary::train {
namespace {

TEST(SampleToken, GreedyIsTheArgmax) {
    const std::vector<float> logits = {0.1f, 2.5f, -1.0f, 2.4f};
    const core::Philox rng(7, 1);
    for (uint64_t i = 0; i < 50; ++i) EXPECT_EQ(sample_token(logits, 0.0, 0, rng, i), 1);
}

TEST(SampleToken, TopKNeverLeavesTheKBest) {
    const std::vector<float> logits = {3.0f, 0.0f, 2.9f, 0.1f, 2.8f, -4.0f};
    const core::Philox rng(3, 2);
    std::vector<int> seen(logits.size(), 0);
    for (uint64_t i = 0; i < 3000; ++i) ++seen[size_t(sample_token(logits, 5.0, 3, rng, i))];
    EXPECT_EQ(seen[1] + seen[3] + seen[5], 0);
    // At a high temperature the three best are close to uniform: each drawn.
    EXPECT_GT(seen[0], 500);
    EXPECT_GT(seen[2], 500);
    EXPECT_GT(seen[4], 500);
    // top_k = 1 is greedy at any temperature.
    for (uint64_t i = 0; i < 50; ++i) EXPECT_EQ(sample_token(logits, 5.0, 1, rng, i), 0);
}

TEST(SampleToken, FollowsTheSoftmaxAtTheTemperature) {
    // p(0) / p(1) = exp((log 3 - 0) / T): 3 at T = 1, sqrt(3) at T = 2.
    const std::vector<float> logits = {float(std::log(3.0)), 0.0f};
    const core::Philox rng(11, 5);
    for (const double T : {1.0, 2.0}) {
        const int n = 20000;
        int zeros = 0;
        for (int i = 0; i < n; ++i) zeros += sample_token(logits, T, 0, rng, uint64_t(i)) == 0;
        const double ratio = std::pow(3.0, 1.0 / T);
        EXPECT_NEAR(double(zeros) / n, ratio / (1 + ratio), 0.015) << "T = " << T;
    }
}

TEST(SampleToken, TheSeedGivesTheSameDraws) {
    const std::vector<float> logits = {0.5f, 0.4f, 0.3f, 0.2f, 0.1f};
    const core::Philox a(42, 9), b(42, 9), c(43, 9);
    int differ = 0;
    for (uint64_t i = 0; i < 200; ++i) {
        EXPECT_EQ(sample_token(logits, 1.0, 0, a, i), sample_token(logits, 1.0, 0, b, i));
        differ += sample_token(logits, 1.0, 0, a, i) != sample_token(logits, 1.0, 0, c, i);
    }
    EXPECT_GT(differ, 50);
}

TEST(Generate, BadOptionsAreRefusedBeforeTheRunIsRead) {
    auto options = [](double temperature, std::string prompt, int tokens) {
        GenerateOptions o;
        o.run_dir = "/nonexistent-run";
        o.temperature = temperature;
        o.prompt = std::move(prompt);
        o.tokens = tokens;
        return o;
    };
    const auto none = [](std::string_view) {};
    EXPECT_THROW(generate(options(std::nan(""), "x", 1), none), ConfigError);
    EXPECT_THROW(generate(options(1.0, "", 1), none), ConfigError);
    EXPECT_THROW(generate(options(1.0, "x", -1), none), ConfigError);
    // Good options reach the run, which is missing.
    EXPECT_THROW(generate(options(1.0, "x", 1), none), IoError);
}

}  // namespace
}  // namespace apiary::train
