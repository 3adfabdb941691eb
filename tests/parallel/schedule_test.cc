// Pipeline schedules as pure functions: every op once, messages paired in
// order without a deadlock (simulated with blocking receives and
// non-blocking sends, as the engine runs them), the activation slots each
// stage needs, and the bubble a replay with equal stage times gives against
// the closed form.

#include "parallel/schedule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "core/error.h"

using namespace apiary::parallel;

namespace {

void expect_complete(PipelineSchedule kind, int p, int m, int v) {
    for (int s = 0; s < p; ++s) {
        const auto ops = pipeline_schedule(kind, p, s, m, v);
        ASSERT_EQ(int(ops.size()), 2 * m * v);
        std::set<std::tuple<bool, int, int>> seen;
        std::vector<int> next_f(size_t(v), 0), next_b(size_t(v), 0);
        for (const auto& op : ops) {
            EXPECT_TRUE(seen.insert({op.forward, op.chunk, op.micro}).second);
            // Each chunk's forwards and backwards in micro-batch order, and a
            // backward only after its forward.
            auto& next = op.forward ? next_f : next_b;
            EXPECT_EQ(op.micro, next[size_t(op.chunk)]++);
            if (!op.forward) {
                EXPECT_GT(next_f[size_t(op.chunk)], op.micro);
            }
        }
    }
}

}  // namespace

TEST(Schedule, EveryOpOnceInOrderForAllKinds) {
    for (int p : {1, 2, 3, 4}) {
        for (int m : {1, 2, 4, 8}) {
            expect_complete(PipelineSchedule::gpipe, p, m, 1);
            if (m >= p) expect_complete(PipelineSchedule::one_f_one_b, p, m, 1);
            if (m % p == 0) {
                for (int v : {2, 3}) expect_complete(PipelineSchedule::interleaved, p, m, v);
            }
        }
    }
}

TEST(Schedule, MessagesPairUpWithoutDeadlock) {
    for (int p : {2, 3, 4, 8}) {
        for (int m : {4, 8, 16}) {
            EXPECT_EQ(check_schedules(PipelineSchedule::gpipe, p, m, 1), "") << p << " " << m;
            if (m >= p) {
                EXPECT_EQ(check_schedules(PipelineSchedule::one_f_one_b, p, m, 1), "")
                    << p << " " << m;
            }
            if (m % p == 0) {
                for (int v : {2, 4}) {
                    EXPECT_EQ(check_schedules(PipelineSchedule::interleaved, p, m, v), "")
                        << p << " " << m << " " << v;
                }
            }
        }
    }
}

TEST(Schedule, TheCheckCatchesMismatchedAndDeadlockedSchedules) {
    std::vector<std::vector<PipeOp>> ops = {pipeline_schedule(PipelineSchedule::gpipe, 2, 0, 4, 1),
                                            pipeline_schedule(PipelineSchedule::gpipe, 2, 1, 4, 1)};
    EXPECT_EQ(check_schedules(ops, 1), "");
    // The last stage runs its backwards in reverse: stage 0 would receive
    // micro-batch 3's gradient where it expects micro-batch 0's.
    auto reversed = ops;
    std::reverse(reversed[1].begin() + 4, reversed[1].end());
    EXPECT_NE(check_schedules(reversed, 1).find("expects micro-batch 0"), std::string::npos);
    // Stage 0 waits for a gradient before sending any activation.
    auto stuck = ops;
    std::rotate(stuck[0].begin(), stuck[0].begin() + 4, stuck[0].end());
    EXPECT_NE(check_schedules(stuck, 1).find("deadlock"), std::string::npos);
}

TEST(Schedule, OneFOneBKeepsAtMostStagesMinusRankInFlight) {
    const int p = 4, m = 8;
    for (int s = 0; s < p; ++s) {
        EXPECT_EQ(slots_needed(pipeline_schedule(PipelineSchedule::one_f_one_b, p, s, m, 1)),
                  p - s);
        EXPECT_EQ(slots_needed(pipeline_schedule(PipelineSchedule::gpipe, p, s, m, 1)), m);
    }
}

TEST(Schedule, ReplayWithEqualStagesGivesTheClosedFormBubble) {
    for (int p : {2, 4}) {
        for (int m : {4, 8, 16}) {
            const std::vector<double> f(size_t(p), 1.0), b(size_t(p), 2.0);
            for (auto kind : {PipelineSchedule::gpipe, PipelineSchedule::one_f_one_b}) {
                for (double idle : replay_idle(kind, p, m, 1, f, b)) {
                    EXPECT_NEAR(idle, ideal_bubble(p, m, 1), 1e-12) << p << " " << m;
                }
            }
            if (m % p == 0) {
                // Interleaving divides the bubble by the virtual stages.
                for (double idle : replay_idle(PipelineSchedule::interleaved, p, m, 2, f, b)) {
                    EXPECT_NEAR(idle, ideal_bubble(p, m, 2), 1e-12) << p << " " << m;
                }
            }
        }
    }
    // A stage twice as slow makes the others wait: they idle more.
    const auto idle = replay_idle(PipelineSchedule::one_f_one_b, 2, 8, 1, {1.0, 2.0}, {2.0, 4.0});
    EXPECT_GT(idle[0], ideal_bubble(2, 8, 1) + 0.2);
}

TEST(Schedule, BadArgumentsAreRefused) {
    EXPECT_THROW(pipeline_schedule(PipelineSchedule::one_f_one_b, 2, 0, 4, 2), apiary::Error);
    EXPECT_THROW(pipeline_schedule(PipelineSchedule::interleaved, 4, 0, 6, 2), apiary::Error);
    EXPECT_THROW(apiary::core::parse_pipeline_schedule("zigzag"), apiary::ConfigError);
}
