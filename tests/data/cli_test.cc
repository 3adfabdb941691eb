// The data verbs through the apiary binary: train, encode, decode, prepare,
// verify, and the one-line errors for bad input.

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "data/shard.h"
#include "test_util.h"

namespace apiary::data {
namespace {

using testing::TempDir;

// (exit code, stdout + stderr) of `apiary <args>`.
std::pair<int, std::string> apiary(const std::string& args) {
    const std::string cmd = std::string(APIARY_BINARY_DIR) + "/apiary " + args + " 2>&1";
    FILE* p = popen(cmd.c_str(), "r");
    std::string out;
    char buf[4096];
    while (size_t n = fread(buf, 1, sizeof(buf), p)) out.append(buf, n);
    const int rc = pclose(p);
    return {WEXITSTATUS(rc), out};
}

TEST(DataCli, TrainEncodeDecodePrepareVerify) {
    TempDir tmp("cli_data");
    std::string text;
    for (int i = 0; i < 400; ++i) text += "the cat sat on the mat " + std::to_string(i) + ".\n";
    testing::write_text(tmp.path("a.txt"), text);
    testing::write_text(tmp.path("b.jsonl"), "{\"text\": \"one doc\"}\n{\"text\": \"two\"}\n");
    const std::string tok = tmp.path("tok.json");
    auto [rc, out] = apiary("tokenizer train --input " + tmp.path("a.txt") + " " +
                            tmp.path("b.jsonl") + " --vocab-size 300 --out " + tok);
    ASSERT_EQ(rc, 0) << out;
    std::tie(rc, out) = apiary("tokenizer encode --tokenizer " + tok + " < " + tmp.path("a.txt") +
                               " > " + tmp.path("ids.txt"));
    ASSERT_EQ(rc, 0) << out;
    std::tie(rc, out) = apiary("tokenizer decode --tokenizer " + tok + " < " + tmp.path("ids.txt"));
    ASSERT_EQ(rc, 0);
    EXPECT_EQ(out, text);

    std::tie(rc, out) =
        apiary("data prepare --input " + tmp.path("a.txt") + " " + tmp.path("b.jsonl") +
               " --tokenizer " + tok + " --out " + tmp.path("shards") + " --unit-kb 1");
    ASSERT_EQ(rc, 0) << out;
    std::tie(rc, out) = apiary("data verify " + tmp.path("shards") + " --tokenizer " + tok);
    EXPECT_EQ(rc, 0) << out;
    EXPECT_NE(out.find("checksums match"), std::string::npos) << out;

    // The manifest's per-shard bytes and its vocabulary size are checked too.
    const std::string manifest = tmp.path("shards/manifest.json");
    const std::string good = testing::read_file_text(manifest);
    auto j = nlohmann::json::parse(good);
    j["shards"][0]["bytes"] = j["shards"][0]["bytes"].get<uint64_t>() + 8;
    testing::write_text(manifest, j.dump());
    std::tie(rc, out) = apiary("data verify " + tmp.path("shards"));
    EXPECT_EQ(rc, 1) << out;
    EXPECT_NE(out.find("bytes, the manifest says"), std::string::npos) << out;
    j = nlohmann::json::parse(good);
    j["tokenizer"]["vocab_size"] = 299;
    testing::write_text(manifest, j.dump());
    std::tie(rc, out) = apiary("data verify " + tmp.path("shards"));
    EXPECT_EQ(rc, 1) << out;
    EXPECT_NE(out.find("vocabulary size 300 (header byte 40) differs from the manifest's 299"),
              std::string::npos)
        << out;
    testing::write_text(manifest, good);

    // One flipped byte in a shard: verify fails with a one-line error naming it.
    const std::string shard = tmp.path("shards/train_000000.bin");
    std::string bytes = testing::read_file_text(shard);
    bytes[kShardHeaderBytes + 3] ^= 0x40;
    testing::write_text(shard, bytes);
    std::tie(rc, out) = apiary("data verify " + tmp.path("shards"));
    EXPECT_EQ(rc, 1);
    EXPECT_EQ(out.rfind("apiary: error: shard '", 0), 0u) << out;
    EXPECT_NE(out.find("train_000000.bin' is corrupt"), std::string::npos) << out;
}

// `apiary train`'s data.corpus: a device that gives nothing is empty (not
// "no such file"), and a corpus too small for one train sample says which way
// data.val_fraction would help.
TEST(DataCli, TrainCorpusErrorsSayWhatIsWrong) {
    TempDir tmp("cli_corpus");
    const std::string common =
        " --set run.dir=" + tmp.path("run") + " --set data.cache_dir=" + tmp.path("cache");
    auto [rc, out] = apiary("train --set data.corpus=/dev/null" + common);
    EXPECT_EQ(rc, 1) << out;
    EXPECT_NE(out.find("apiary: error: data.corpus: '/dev/null' is empty"), std::string::npos)
        << out;
    std::string text;
    for (int i = 0; text.size() < 3000; ++i) text += "the cat sat on the mat " + std::to_string(i);
    testing::write_text(tmp.path("c.txt"), text);
    std::tie(rc, out) = apiary("train --set data.corpus=" + tmp.path("c.txt") +
                               " --set train.seq_len=1024" + common);
    EXPECT_EQ(rc, 1) << out;
    EXPECT_NE(out.find("has no train sample of 1025 tokens (train.seq_len + 1); use more text, a "
                       "smaller data.val_fraction, or a shorter train.seq_len"),
              std::string::npos)
        << out;
    EXPECT_FALSE(std::filesystem::exists(tmp.path("run")));
}

TEST(DataCli, MalformedTokenizerIsAOneLineError) {
    TempDir tmp("cli_badtok");
    testing::write_text(tmp.path("tok.json"), "{\"model\": {\"type\": \"BPE\", \"vocab\": 3}}");
    auto [rc, out] = apiary("tokenizer encode --tokenizer " + tmp.path("tok.json") + " --text hi");
    EXPECT_EQ(rc, 1);
    EXPECT_EQ(out.rfind("apiary: error: tokenizer '", 0), 0u) << out;
    EXPECT_NE(out.find("model.vocab is missing or not an object"), std::string::npos) << out;
}

}  // namespace
}  // namespace apiary::data
