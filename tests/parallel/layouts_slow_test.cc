// Three-dimensional parallelism on 8 ranks (tp 2 x pp 2 x dp 2) against one
// rank: the layout every large run uses, too slow for the quick suite.

#include <gtest/gtest.h>

#include <filesystem>

#include "layout_util.h"

using namespace apiary::testing;
namespace fs = std::filesystem;

TEST(Layouts3d, TpPpDpOnEightRanksMatchesOneRank) {
    const fs::path dir = fs::temp_directory_path() / ("apiary_3d_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    LayoutRuns runs(dir);
    const std::string common =
        "--set model.preset=tiny-llama --set model.n_layer=4 --set model.n_embd=128 "
        "--set model.n_head=8 --set model.n_kv_head=4 --set data.tokenizer=byte "
        "--set train.steps=10 --set train.seq_len=64 --set train.grad_accum=4 "
        "--set train.log_every=1 --set train.eval_every=5 --set train.eval_batches=2 "
        "--set train.threads=1 --set train.warmup_steps=3 --set train.lr=1e-3 ";
    ASSERT_EQ(runs.run("base", 1, common + "--set train.batch_size=4").exit_code, 0);
    ASSERT_EQ(runs.run("init", 1,
                       common + "--set train.batch_size=4 --set train.steps=1 --set train.lr=0 "
                                "--set train.min_lr=0 --set train.warmup_steps=0")
                  .exit_code,
              0);
    const auto r = runs.run("3d", 8,
                            common +
                                "--set train.batch_size=2 --set parallel.tp=2 "
                                "--set parallel.pp=2 --set parallel.zero_stage=1");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    runs.expect_series_near("base", "3d", "loss", 10, 1e-5);
    runs.expect_series_near("base", "3d", "grad_norm", 10, 1e-4);
    EXPECT_LT(runs.update_difference("base", "3d", "init", 10), 1e-4);
    fs::remove_all(dir);
}
