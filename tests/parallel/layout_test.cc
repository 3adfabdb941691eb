// The parallel layout from config: the stage split balanced by the
// planner's cost model or given as a list, the shard each rank holds, and
// every inconsistency refused with the numbers and what would work.

#include "model/layout.h"

#include <gtest/gtest.h>

#include <numeric>

#include "core/config.h"
#include "core/error.h"
#include "parallel/layout.h"
#include "train/keys.h"

using namespace apiary;

namespace {

core::Schema schema() {
    core::Schema s;
    core::add_shared_keys(s);
    train::add_keys(s);
    return s;
}

core::Config config(const std::vector<std::string>& sets) {
    static const core::Schema s = schema();
    core::Config c(s);
    c.set("model.preset=tiny");
    for (const auto& kv : sets) c.set(kv);
    return c;
}

// The error text of building a layout, "" if it builds.
std::string error_of(const std::vector<std::string>& sets, int world) {
    try {
        const core::Config c = config(sets);
        parallel::parallel_layout_from(c, core::model_spec_from(c), world);
    } catch (const ConfigError& e) {
        return e.what();
    }
    return "";
}

}  // namespace

TEST(ParallelLayout, BalancedStagesGiveTheHeadsStageFewerBlocks) {
    core::ModelSpec spec = core::preset("gpt2-124m");
    const auto counts = parallel::balanced_stage_layers(spec, 2, 1024);
    EXPECT_EQ(std::accumulate(counts.begin(), counts.end(), 0), 12);
    // The LM head costs several blocks (6 V C against 6 x 12 C^2 + attention
    // per token): the last stage gets fewer blocks.
    EXPECT_GT(counts[0], counts[1]);
    // With a tiny vocabulary the split is even.
    spec.vocab_size = 64;
    EXPECT_EQ(parallel::balanced_stage_layers(spec, 4, 1024), (std::vector<int>{3, 3, 3, 3}));
}

TEST(ParallelLayout, ShardsOfTheRanks) {
    const core::Config c =
        config({"parallel.tp=2", "parallel.pp=2", "parallel.schedule=interleaved",
                "parallel.virtual_stages=2", "train.grad_accum=4"});
    const auto l = parallel::parallel_layout_from(c, core::model_spec_from(c), 8);
    EXPECT_EQ(l.dp(), 2);
    ASSERT_EQ(l.stage_blocks.size(), 4u);            // 4 blocks over 2 x 2 virtual stages
    const model::ModelShard s = l.shard({1, 1, 1});  // dp 1, tp 1, pp 1
    EXPECT_EQ(s.tp_rank, 1);
    EXPECT_FALSE(s.embedding);
    EXPECT_TRUE(s.head);
    // Stage 1 holds virtual stages 1 and 3.
    EXPECT_EQ(s.chunks, (std::vector<std::vector<int>>{{1}, {3}}));
}

TEST(ParallelLayout, ExplicitStageListIsUsedAsGiven) {
    const core::Config c =
        config({"parallel.pp=2", "train.grad_accum=2", "parallel.stage_layers=3,1"});
    const auto l = parallel::parallel_layout_from(c, core::model_spec_from(c), 2);
    EXPECT_EQ(l.stage_blocks, (std::vector<std::vector<int>>{{0, 1, 2}, {3}}));
}

TEST(ParallelLayout, EveryInconsistencyIsNamed) {
    // tiny: 4 blocks, 6 heads (6 KV heads), C = 192, MLP 768.
    EXPECT_NE(error_of({"parallel.tp=4"}, 4)
                  .find("parallel.tp = 4 does not divide model.n_head "
                        "= 6"),
              std::string::npos);
    EXPECT_NE(error_of({"parallel.tp=4"}, 4).find("tp can be 1, 2, 3, 6"), std::string::npos);
    EXPECT_NE(
        error_of(
            {"model.preset=tiny-llama", "model.n_kv_head=2", "parallel.tp=4", "model.n_head=8"}, 4)
            .find("does not divide model.n_kv_head = 2"),
        std::string::npos);
    EXPECT_NE(error_of({"parallel.pp=2", "train.grad_accum=1"}, 2)
                  .find("1F1B needs at least as many micro-batches as stages"),
              std::string::npos);
    EXPECT_NE(error_of({"parallel.pp=8", "train.grad_accum=8"}, 8)
                  .find("every stage needs at least one block"),
              std::string::npos);
    EXPECT_NE(error_of({"parallel.pp=2", "parallel.schedule=interleaved",
                        "parallel.virtual_stages=3", "train.grad_accum=2"},
                       2)
                  .find("does not divide model.n_layer = 4"),
              std::string::npos);
    EXPECT_NE(error_of({"parallel.pp=2", "parallel.schedule=interleaved", "train.grad_accum=3"}, 2)
                  .find("to be a multiple of parallel.pp = 2"),
              std::string::npos);
    EXPECT_NE(error_of({"parallel.schedule=interleaved"}, 1).find("needs parallel.pp > 1"),
              std::string::npos);
    EXPECT_NE(error_of({"parallel.pp=2", "train.grad_accum=2", "parallel.stage_layers=3,2"}, 2)
                  .find("2 entries summing to 5, but the model has model.n_layer = 4"),
              std::string::npos);
    EXPECT_NE(error_of({"parallel.pp=2", "train.grad_accum=2", "parallel.stage_layers=3,x"}, 2)
                  .find("'x' is not a block count"),
              std::string::npos);
    EXPECT_NE(error_of({"parallel.tp=2"}, 3).find("world size 3 is not divisible by tp(2)"),
              std::string::npos);
    EXPECT_NE(error_of({"parallel.tp=2", "parallel.dp=3"}, 4).find("!= world size 4"),
              std::string::npos);
    EXPECT_NE(error_of({"parallel.sequence_parallel=true"}, 1).find("needs tensor parallelism"),
              std::string::npos);
    EXPECT_NE(error_of({"parallel.tp=2", "parallel.sequence_parallel=true", "train.batch_size=1",
                        "train.seq_len=7"},
                       2)
                  .find("1 x 7 = 7 rows does not split over parallel.tp = 2"),
              std::string::npos);
    EXPECT_NE(error_of({"parallel.pp=2", "train.grad_accum=2", "parallel.zero_stage=2"}, 4)
                  .find("use parallel.zero_stage = 1 with pipeline parallelism"),
              std::string::npos);
    EXPECT_NE(error_of({"parallel.microbatches=4", "train.grad_accum=2"}, 1)
                  .find("parallel.microbatches = 4 but train.grad_accum = 2"),
              std::string::npos);
    EXPECT_THROW(core::parse_recompute("half"), ConfigError);
    EXPECT_EQ(error_of({"parallel.tp=2", "parallel.pp=2", "train.grad_accum=2"}, 4), "");
}

TEST(ParallelLayout, VocabularySlicesCoverTheVocabularyOnce) {
    for (int V : {257, 256, 53}) {
        for (int tp : {1, 2, 3, 4}) {
            int64_t next = 0;
            for (int r = 0; r < tp; ++r) {
                int64_t begin = 0, count = 0;
                model::vocab_slice(V, tp, r, &begin, &count);
                EXPECT_EQ(begin, next);
                EXPECT_GT(count, 0);
                next = begin + count;
            }
            EXPECT_EQ(next, V);
        }
    }
}

TEST(ParallelLayout, ExpertParallelismIsCarvedOutOfTheDataParallelRanks) {
    const std::vector<std::string> moe = {"model.n_expert=8", "model.n_expert_active=2"};
    auto with = [&](std::vector<std::string> extra) {
        extra.insert(extra.begin(), moe.begin(), moe.end());
        return extra;
    };
    // ep 4 of 8 dp ranks: consecutive dp ranks form an ep group; rank r
    // holds experts of ep rank r % 4.
    const core::Config c = config(with({"parallel.ep=4"}));
    const auto l = parallel::parallel_layout_from(c, core::model_spec_from(c), 8);
    EXPECT_EQ(l.ep, 4);
    EXPECT_EQ(l.shard({5, 0, 0}).ep_rank, 1);
    EXPECT_EQ(l.shard({5, 0, 0}).ep_size, 4);
    EXPECT_NE(l.describe().find("dp 8 (ep 4)"), std::string::npos) << l.describe();
    // Each refusal names the key, the value and what would work.
    EXPECT_EQ(error_of(with({"parallel.ep=3"}), 6),
              "parallel.ep = 3 does not divide model.n_expert = 8: every expert-parallel rank "
              "holds the same number of experts; ep can be 1, 2 (within the data-parallel ranks)");
    EXPECT_EQ(error_of(with({"parallel.ep=8"}), 4),
              "parallel.ep = 8 does not divide the 4 data-parallel ranks (parallel.dp): the "
              "expert-parallel groups are carved out of them; ep can be 1, 2, 4");
    EXPECT_NE(error_of({"parallel.ep=2"}, 2).find("parallel.ep = 2 needs a mixture-of-experts "
                                                  "model (model.n_expert > 0)"),
              std::string::npos);
    EXPECT_NE(error_of(with({"parallel.ep=2", "parallel.zero_stage=3"}), 4)
                  .find("parallel.zero_stage = 3 with parallel.ep = 2: expert parallelism runs "
                        "with ZeRO stages 0-2"),
              std::string::npos);
    EXPECT_NE(error_of(with({"parallel.ep=2", "parallel.tp=2"}), 4)
                  .find("parallel.ep = 2 with parallel.tp = 2: expert parallelism runs with data "
                        "and pipeline parallelism"),
              std::string::npos);
    EXPECT_EQ(error_of(with({"parallel.ep=2", "parallel.zero_stage=1"}), 4), "");
}
