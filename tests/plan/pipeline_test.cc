// Pipeline stages of unequal cost: parallel.stage_layers, the embedding on
// the first stage and the LM head on the last, for every schedule.

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/stage_split.h"
#include "plan/memory.h"
#include "plan/step_time.h"
#include "test_util.h"

namespace apiary::plan::test {
namespace {

using Sets = std::vector<std::string>;

// LLaMA 60M widened to 16 blocks (its 32,000-way head weighs about five
// blocks) on 4 H100s as one pipeline of 8 micro-batches.
Sets llama_pp4(const std::string& schedule) {
    return {"model.preset=llama-60m",
            "model.n_layer=16",
            "cluster.device=H100-SXM",
            "cluster.gpus=4",
            "parallel.pp=4",
            "train.batch_size=4",
            "train.grad_accum=8",
            "train.seq_len=256",
            "train.precision=bf16",
            "parallel.schedule=" + schedule,
            "parallel.virtual_stages=2"};
}

std::vector<int> blocks_of(const PlanInput& in) {
    return stage_split(in.w, in.l, in.c.impl).blocks;
}

double most(const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); }

TEST(PlanPipeline, StageLayersAreHonouredByEverySchedule) {
    // The same blocks moved from the first stage to the head's: chunk c of
    // stage s is virtual stage c pp + s when interleaved.
    const std::vector<std::tuple<std::string, std::string, std::string>> cases = {
        {"gpipe", "10,2,2,2", "2,2,2,10"},
        {"1f1b", "10,2,2,2", "2,2,2,10"},
        {"interleaved", "9,1,1,1,1,1,1,1", "1,1,1,1,1,1,1,9"}};
    for (const auto& [sched, first, last] : cases) {
        const auto a = input(llama_pp4(sched) + Sets{"parallel.stage_layers=" + first});
        const auto b = input(llama_pp4(sched) + Sets{"parallel.stage_layers=" + last});
        EXPECT_EQ(blocks_of(a), (std::vector<int>{10, 2, 2, 2})) << sched;
        EXPECT_EQ(blocks_of(b), (std::vector<int>{2, 2, 2, 10})) << sched;
        const StepTime sa = step_time(a.w, a.l, a.c), sb = step_time(b.w, b.l, b.c);
        EXPECT_GT(sa.stage_busy_s[0], sa.stage_busy_s[3]) << sched;
        EXPECT_GT(sb.stage_busy_s[3], sb.stage_busy_s[0]) << sched;
        // The same work in total; the head's stage with ten blocks is the
        // slower pipeline, and every step lasts at least its slowest stage.
        EXPECT_NEAR(sa.compute, sb.compute, 1e-9 * sa.compute) << sched;
        EXPECT_GT(sb.total, sa.total) << sched;
        EXPECT_GE(sb.total, most(sb.stage_busy_s)) << sched;
        // An even split of the same layout is faster than either.
        const auto even = input(llama_pp4(sched));
        EXPECT_LT(step_time(even.w, even.l, even.c).total, sa.total) << sched;
        // Memory follows the stage's blocks too.
        EXPECT_GT(memory_per_device(a.w, a.l, a.c).activations,
                  memory_per_device(even.w, even.l, even.c).activations)
            << sched;
    }
}

TEST(PlanPipeline, TheHeadCostsTheLastStage) {
    // Four times the vocabulary: the head's extra work lands on the last
    // stage and the whole step waits for it, once per micro-batch.
    const auto small = input(llama_pp4("1f1b"));
    const auto big = input(llama_pp4("1f1b") + Sets{"model.vocab_size=128000"});
    const StepTime s = step_time(small.w, small.l, small.c);
    const StepTime b = step_time(big.w, big.l, big.c);
    const double last = b.stage_busy_s[3] - s.stage_busy_s[3];
    EXPECT_GT(last, 0.05 * s.total);
    EXPECT_LT(b.stage_busy_s[1] - s.stage_busy_s[1], 1e-9 * s.total);  // a middle stage
    EXPECT_GE(b.total - s.total, 0.95 * last);
    // The head makes the last stage the slowest, so the pipeline idles
    // more than equal stages would: (p - 1)/(v m) = 3/8.
    EXPECT_GT(s.bubble_fraction, 1.2 * bubble_fraction(4, 8, 1));
}

TEST(PlanPipeline, EqualStagesKeepTheScheduleBubble) {
    // A vocabulary of 256: head and embedding are a few percent of a stage.
    for (auto [sched, v] : {std::pair{"gpipe", 1}, std::pair{"1f1b", 1}, {"interleaved", 2}}) {
        const auto in = input(llama_pp4(sched) + Sets{"model.vocab_size=256"});
        const StepTime st = step_time(in.w, in.l, in.c);
        EXPECT_NEAR(st.bubble_fraction, bubble_fraction(4, 8, v), 0.05 * bubble_fraction(4, 8, v))
            << sched;
    }
}

TEST(PlanPipeline, ApiaryStagesAreTheTrainersSplit) {
    // The trainer balances a pipeline by FLOPs with the head counted
    // (core::balanced_stage_layers): the head's stage gets fewer blocks.
    const auto in = input({"model.preset=llama-60m", "cluster.gpus=4", "parallel.pp=4",
                           "train.batch_size=1", "train.grad_accum=8", "train.seq_len=128"});
    ASSERT_EQ(in.c.impl, Impl::apiary);
    const auto blocks = blocks_of(in);
    EXPECT_EQ(blocks, core::balanced_stage_layers(in.w.model, 4, 128));
    EXPECT_LT(blocks[3], blocks[0]);
    // Megatron splits evenly when pp divides the layers.
    const auto meg =
        input({"model.preset=llama-60m", "cluster.gpus=4", "parallel.pp=4", "train.batch_size=1",
               "train.grad_accum=8", "train.seq_len=128", "cluster.implementation=megatron"});
    EXPECT_EQ(blocks_of(meg), (std::vector<int>{2, 2, 2, 2}));
}

TEST(PlanPipeline, BadStageListsAreNamed) {
    auto error = [](const std::string& list) {
        try {
            input(llama_pp4("1f1b") + Sets{"parallel.stage_layers=" + list});
        } catch (const ConfigError& e) {
            return std::string(e.what());
        }
        return std::string();
    };
    EXPECT_NE(error("4,4,4").find("3 entries summing to 12, but the model has model.n_layer = 16"),
              std::string::npos);
    EXPECT_NE(error("4,4,x,4").find("'x' is not a block count"), std::string::npos);
    EXPECT_NE(error("8,8,0,0").find("'0' is not a block count"), std::string::npos);
}

}  // namespace
}  // namespace apiary::plan::test
