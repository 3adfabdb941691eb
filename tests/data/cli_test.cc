// The data verbs through the apiary binary: train, encode, decode, prepare,
// verify, and the one-line errors for bad input.

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>

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
