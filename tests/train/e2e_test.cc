// The default main job, shortened, end to end through the CLI: train a BPE
// tokenizer on the King James Bible (or find it in the cache), the tiny
// model on its tokens, check the held-out loss falls well below the unigram
// baseline of that tokenization, then sample text containing English words,
// decoded with the run's tokenizer.

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>

#include "../cli_util.h"

using namespace apiary::testing;
namespace fs = std::filesystem;

TEST(DefaultJob, TrainsBelowUnigramAndGeneratesWords) {
    const fs::path run = fs::temp_directory_path() / ("apiary_e2e_" + std::to_string(::getpid()));
    fs::remove_all(run);
    const auto t = run_command(apiary_bin() + " train --set run.dir=" + run.string() +
                               " --set train.steps=300 --set train.warmup_steps=30 "
                               "--set train.eval_every=100 --set train.batch_size=16 "
                               "--set train.seq_len=64");
    ASSERT_EQ(t.exit_code, 0) << t.output;
    EXPECT_NE(t.output.find("step 300/300"), std::string::npos) << t.output;

    // Unigram loss from the banner, final eval loss from metrics.jsonl.
    std::smatch m;
    ASSERT_TRUE(std::regex_search(t.output, m, std::regex("unigram loss ([0-9.]+)")));
    const double unigram = std::stod(m[1]);
    std::ifstream in(run / "metrics.jsonl");
    std::string line;
    double eval = 1e9;
    int eval_lines = 0;
    while (std::getline(in, line)) {
        const auto j = nlohmann::json::parse(line);
        if (j.contains("eval_loss")) eval = j["eval_loss"], ++eval_lines;
    }
    EXPECT_EQ(eval_lines, 3);
    // 300 short steps: the model must already have learned far more than
    // token frequencies (unigram 6.03 nats/token with the 2048-token BPE;
    // 4.38 reached when written).
    EXPECT_LT(eval, unigram - 1.2) << "eval " << eval << " unigram " << unigram;
    EXPECT_TRUE(fs::exists(run / "tokenizer.json"));

    const auto g = run_command(apiary_bin() + " generate --run " + run.string() +
                               " --prompt 'And the LORD said' --tokens 200 --seed 3");
    ASSERT_EQ(g.exit_code, 0) << g.output;
    int words = 0;
    for (const char* w : {" the ", " and ", " of ", " unto ", " he ", " that ", " in ", " his ",
                          " him ", " shall ", " LORD", " is ", " be "}) {
        if (g.output.find(w) != std::string::npos) ++words;
    }
    EXPECT_GE(words, 2) << g.output;
    fs::remove_all(run);
}
