// plan search: enumerates, drops with reasons, ranks; bad layouts get clear errors.

#include "plan/search.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "test_util.h"

namespace apiary::plan {
namespace {

using test::input;
using test::search_in;

TEST(PlanSearch, RanksFittingLayoutsByTime) {
    auto in = search_in({"model.preset=gpt3-13b", "cluster.device=A100-80GB", "cluster.gpus=64",
                         "plan.global_batch=512", "train.seq_len=2048", "train.precision=bf16"});
    SearchOptions o;
    o.top = 5;
    const SearchResult r = search(in.w, in.c, o);
    ASSERT_EQ(r.best.size(), 5u);
    EXPECT_GT(r.candidates, 1000);
    EXPECT_GT(r.dropped.at("out of memory"), 0);  // e.g. 13B unsharded on one GPU each
    for (size_t i = 0; i < r.best.size(); ++i) {
        EXPECT_TRUE(r.best[i].fits);
        EXPECT_EQ(r.best[i].l.devices(), 64);
        EXPECT_EQ(r.best[i].l.dp * r.best[i].l.micro_batch * r.best[i].l.n_micro, 512);
        if (i > 0) {
            EXPECT_LE(r.best[i - 1].st.total, r.best[i].st.total);
        }
    }
    // The winner is at least as fast as a hand-picked sensible layout.
    auto hand = input({"model.preset=gpt3-13b", "cluster.device=A100-80GB", "cluster.gpus=64",
                       "plan.global_batch=512", "train.seq_len=2048", "train.precision=bf16",
                       "parallel.tp=8", "train.batch_size=1", "parallel.recompute=selective"});
    EXPECT_LE(r.best[0].st.total, evaluate(hand.w, hand.l, hand.c).st.total);
}

TEST(PlanSearch, CostRankingCanPreferFewerDevices) {
    auto in = search_in({"model.preset=gpt2-350m", "cluster.device=A100-80GB", "cluster.gpus=256",
                         "plan.global_batch=256", "train.seq_len=1024", "plan.tokens=1e10"});
    SearchOptions o;
    o.vary_devices = true;
    o.top = 1;
    const SearchResult by_time = search(in.w, in.c, o);
    o.by_cost = true;
    const SearchResult by_cost = search(in.w, in.c, o);
    ASSERT_FALSE(by_time.best.empty());
    ASSERT_FALSE(by_cost.best.empty());
    EXPECT_LE(by_cost.best[0].tot.cost_usd, by_time.best[0].tot.cost_usd);
    EXPECT_LE(by_time.best[0].st.total, by_cost.best[0].st.total);
    EXPECT_LT(by_cost.best_devices[0], by_time.best_devices[0]);
}

TEST(PlanSearch, FitsNowhereSaysWhatWouldBeNeeded) {
    auto in = search_in({"model.preset=llama3-405b", "cluster.device=A100-40GB", "cluster.gpus=8",
                         "plan.global_batch=8", "train.seq_len=8192", "train.precision=bf16"});
    const SearchResult r = search(in.w, in.c, SearchOptions{});
    EXPECT_TRUE(r.best.empty());
    const std::string msg = fits_nowhere(in.w, in.c, r);
    EXPECT_NE(msg.find("fit no layout"), std::string::npos) << msg;
    EXPECT_NE(msg.find("devices"), std::string::npos) << msg;
    EXPECT_NE(msg.find("A100-40GB"), std::string::npos) << msg;
}

TEST(PlanSearch, LayoutsThatDoNotDivideAreConfigErrors) {
    EXPECT_THROW(input({"model.preset=gpt3-175b", "cluster.gpus=64", "parallel.tp=5"}),
                 ConfigError);
    try {
        input({"model.preset=gpt3-175b", "cluster.gpus=60", "parallel.tp=8"});
        FAIL();
    } catch (const ConfigError& e) {
        EXPECT_NE(std::string(e.what()).find("not divisible"), std::string::npos) << e.what();
    }
    try {
        input({"model.preset=gpt3-175b", "cluster.gpus=56", "parallel.pp=56",
               "parallel.schedule=interleaved", "parallel.virtual_stages=2"});
        FAIL();
    } catch (const ConfigError& e) {
        EXPECT_NE(std::string(e.what()).find("model.n_layer = 96"), std::string::npos) << e.what();
    }
    // Interleaving needs a pipeline; context parallelism a sequence it divides;
    // experts a model that has them.
    EXPECT_THROW(
        input({"model.preset=gpt3-175b", "cluster.gpus=8", "parallel.schedule=interleaved"}),
        ConfigError);
    EXPECT_THROW(
        input({"model.preset=gpt3-175b", "cluster.gpus=8", "parallel.cp=3", "train.seq_len=2048"}),
        ConfigError);
    EXPECT_THROW(input({"model.preset=gpt3-175b", "cluster.gpus=8", "parallel.ep=2"}), ConfigError);
    try {
        input({"model.preset=gpt3-175b", "train.seq_len=4096"});
        FAIL();
    } catch (const ConfigError& e) {
        EXPECT_NE(std::string(e.what()).find("model.max_seq_len = 2048"), std::string::npos)
            << e.what();
    }
    EXPECT_THROW(input({"model.preset=gpt3-175b", "cluster.gpus=128", "parallel.pp=128"}),
                 ConfigError);
    // An uneven split (Llama 3: 126 layers on 16 stages) is allowed.
    EXPECT_NO_THROW(input({"model.preset=llama3-405b", "cluster.gpus=16", "parallel.pp=16"}));
    try {
        input({"cluster.device=Z100"});
        FAIL();
    } catch (const ConfigError& e) {
        EXPECT_NE(std::string(e.what()).find("A100-80GB"), std::string::npos) << e.what();
    }
}

}  // namespace
}  // namespace apiary::plan
