// `apiary train` on data.corpus prepares a tokenizer and shards once: a
// second run with the same text and settings finds them in data.cache_dir,
// and a changed setting makes a new entry instead of reusing a wrong one.

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "../cli_util.h"

using namespace apiary::testing;
namespace fs = std::filesystem;

namespace {

class TrainCache : public ::testing::Test {
  protected:
    void SetUp() override {
        dir_ = fs::temp_directory_path() /
               ("apiary_cache_" + std::to_string(::getpid()) + "_" +
                ::testing::UnitTest::GetInstance()->current_test_info()->name());
        fs::remove_all(dir_);
        fs::create_directories(dir_);
        std::ofstream out(dir_ / "corpus.txt");
        for (int i = 0; i < 3000; ++i) out << "Let there be light " << i << ", and there was.\n";
    }
    void TearDown() override { fs::remove_all(dir_); }

    CommandResult train(const std::string& run, const std::string& extra = "") {
        return run_command(apiary_bin() +
                           " train --overwrite --set run.dir=" + (dir_ / run).string() +
                           " --set data.corpus=" + (dir_ / "corpus.txt").string() +
                           " --set data.cache_dir=" + (dir_ / "cache").string() +
                           " --set train.steps=2 --set train.batch_size=2 --set train.seq_len=16 "
                           "--set model.n_layer=1 --set train.eval_batches=1 " +
                           extra);
    }
    size_t entries(const std::string& prefix) {
        size_t n = 0;
        for (const auto& e : fs::directory_iterator(dir_ / "cache")) {
            n += e.path().filename().string().rfind(prefix, 0) == 0;
        }
        return n;
    }
    fs::path dir_;
};

}  // namespace

TEST_F(TrainCache, SecondRunFindsTheTokenizerAndShards) {
    const auto a = train("a");
    ASSERT_EQ(a.exit_code, 0) << a.output;
    EXPECT_NE(a.output.find("data: training a byte-level BPE of 2048 tokens"), std::string::npos)
        << a.output;
    EXPECT_NE(a.output.find("data: tokenizing"), std::string::npos) << a.output;
    const auto b = train("b");
    ASSERT_EQ(b.exit_code, 0) << b.output;
    EXPECT_EQ(b.output.find("data: "), std::string::npos) << b.output;
    EXPECT_EQ(entries("bpe-"), 1u);
    EXPECT_EQ(entries("shards-"), 1u);
    // No temporary entry is left behind.
    EXPECT_EQ(
        entries("shards-") + entries("bpe-"),
        size_t(std::distance(fs::directory_iterator(dir_ / "cache"), fs::directory_iterator())));
    // Both runs trained on the same tokens with the same tokenizer.
    std::ifstream ta(dir_ / "a" / "tokenizer.json"), tb(dir_ / "b" / "tokenizer.json");
    EXPECT_EQ(std::string(std::istreambuf_iterator<char>(ta), {}),
              std::string(std::istreambuf_iterator<char>(tb), {}));
}

TEST_F(TrainCache, ChangedSettingsMakeNewEntries) {
    ASSERT_EQ(train("a").exit_code, 0);
    const auto v = train("v", "--set data.bpe_vocab_size=400");
    ASSERT_EQ(v.exit_code, 0) << v.output;
    EXPECT_NE(v.output.find("BPE of 400 tokens"), std::string::npos) << v.output;
    EXPECT_EQ(entries("bpe-"), 2u);
    EXPECT_EQ(entries("shards-"), 2u);
    // The same tokenizer with another held-out fraction: new shards only.
    const auto f = train("f", "--set data.bpe_vocab_size=400 --set data.val_fraction=0.1");
    ASSERT_EQ(f.exit_code, 0) << f.output;
    EXPECT_EQ(f.output.find("training a byte-level BPE"), std::string::npos) << f.output;
    EXPECT_EQ(entries("bpe-"), 2u);
    EXPECT_EQ(entries("shards-"), 3u);
    // A changed corpus is another corpus.
    std::ofstream(dir_ / "corpus.txt", std::ios::app) << "And God saw the light.\n";
    ASSERT_EQ(train("c").exit_code, 0);
    EXPECT_EQ(entries("bpe-"), 3u);
    EXPECT_EQ(entries("shards-"), 4u);
}

TEST_F(TrainCache, AGivenTokenizerIsUsedNotTrained) {
    const std::string tok = (dir_ / "given.json").string();
    ASSERT_EQ(run_command(apiary_bin() + " tokenizer train --input " +
                          (dir_ / "corpus.txt").string() + " --vocab-size 300 --out " + tok)
                  .exit_code,
              0);
    const auto r = train("given", "--set data.tokenizer_file=" + tok);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(r.output.find("training a byte-level BPE"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("tokenized as " + tok), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("V=300"), std::string::npos) << r.output;
    EXPECT_EQ(entries("bpe-"), 0u);
    std::ifstream a(tok), b(dir_ / "given" / "tokenizer.json");
    EXPECT_EQ(std::string(std::istreambuf_iterator<char>(a), {}),
              std::string(std::istreambuf_iterator<char>(b), {}));
}
