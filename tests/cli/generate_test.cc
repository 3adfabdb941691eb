// `apiary generate` decodes with the tokenizer saved in the run: a BPE run
// (shards from `apiary data prepare`), a byte-level run, and the errors when
// the run's tokenizer is unknown or another one is given.

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "../cli_util.h"

using namespace apiary::testing;
namespace fs = std::filesystem;

namespace {

class Generate : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        dir_ = fs::temp_directory_path() / ("apiary_generate_" + std::to_string(::getpid()));
        fs::remove_all(dir_);
        fs::create_directories(dir_);
        std::ofstream(dir_ / "corpus.txt") << [] {
            std::string s;
            for (int i = 0; i < 1500; ++i) s += "The LORD is my shepherd; I shall not want.\n";
            return s;
        }();
        std::ofstream(dir_ / "other.txt") << "Quick brown foxes jump over lazy dogs.\n";
        for (const char* name : {"corpus", "other"}) {
            run_command(apiary_bin() + " tokenizer train --input " +
                        (dir_ / (std::string(name) + ".txt")).string() +
                        " --vocab-size 300 --out " +
                        (dir_ / (std::string(name) + ".json")).string());
        }
        run_command(apiary_bin() + " data prepare --input " + (dir_ / "corpus.txt").string() +
                    " --tokenizer " + (dir_ / "corpus.json").string() + " --out " +
                    (dir_ / "shards").string() + " --unit-kb 4");
    }
    static void TearDownTestSuite() { fs::remove_all(dir_); }

    static CommandResult train(const std::string& name, const std::string& extra) {
        return run_command(apiary_bin() + " train --set run.dir=" + (dir_ / name).string() +
                           " --set train.steps=30 --set train.batch_size=4 --set "
                           "train.seq_len=32 --set model.n_layer=1 --set train.lr=1e-2 "
                           "--set train.warmup_steps=5 --set train.eval_batches=1 " +
                           extra);
    }
    static CommandResult generate(const std::string& name, const std::string& extra = "") {
        return run_command(apiary_bin() + " generate --run " + (dir_ / name).string() +
                           " --prompt 'The LORD' --tokens 20 --seed 1 " + extra);
    }
    static fs::path dir_;
};
fs::path Generate::dir_;

}  // namespace

TEST_F(Generate, BpeRunDecodesWithItsTokenizer) {
    const auto t =
        train("bpe", "--set data.sources=" + (dir_ / "shards").string() +
                         " --set data.tokenizer_file=" + (dir_ / "corpus.json").string());
    ASSERT_EQ(t.exit_code, 0) << t.output;
    EXPECT_TRUE(fs::exists(dir_ / "bpe" / "tokenizer.json"));
    const auto g = generate("bpe");
    ASSERT_EQ(g.exit_code, 0) << g.output;
    // 30 steps on one repeated line: its words come back.
    EXPECT_EQ(g.output.rfind("The LORD", 0), 0u) << g.output;
    EXPECT_TRUE(g.output.find("shepherd") != std::string::npos ||
                g.output.find(" shall") != std::string::npos)
        << g.output;
}

TEST_F(Generate, ByteRunDecodesBytes) {
    const auto t = train("byte", "--set data.corpus=" + (dir_ / "corpus.txt").string() +
                                     " --set data.tokenizer=byte");
    ASSERT_EQ(t.exit_code, 0) << t.output;
    EXPECT_NE(t.output.find("V=257"), std::string::npos) << t.output;
    const auto g = generate("byte");
    ASSERT_EQ(g.exit_code, 0) << g.output;
    EXPECT_EQ(g.output.rfind("The LORD", 0), 0u) << g.output;
    // 20 tokens of one byte each, then a newline.
    EXPECT_EQ(g.output.size(), std::string("The LORD").size() + 20 + 1) << g.output;
}

TEST_F(Generate, RunWithoutTokenizerNeedsOneAndOnlyItsOwn) {
    const auto t = train("anon", "--set data.sources=" + (dir_ / "shards").string());
    ASSERT_EQ(t.exit_code, 0) << t.output;
    EXPECT_FALSE(fs::exists(dir_ / "anon" / "tokenizer.json"));
    const auto none = generate("anon");
    EXPECT_NE(none.exit_code, 0);
    EXPECT_NE(none.output.find("pass --tokenizer FILE"), std::string::npos) << none.output;
    const auto other = generate("anon", "--tokenizer " + (dir_ / "other.json").string());
    EXPECT_NE(other.exit_code, 0);
    EXPECT_NE(other.output.find("but the checkpoint was trained with"), std::string::npos)
        << other.output;
    const auto own = generate("anon", "--tokenizer " + (dir_ / "corpus.json").string());
    EXPECT_EQ(own.exit_code, 0) << own.output;
}
