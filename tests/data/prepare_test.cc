// `data prepare`: formats, document index, validation split, resume, errors.

#include "data/prepare.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <zstd.h>

#include <algorithm>
#include <filesystem>

#include "core/error.h"
#include "data/bpe_train.h"
#include "data/file_io.h"
#include "data/shard.h"
#include "data/tokenizer.h"
#include "test_util.h"

namespace apiary::data {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

std::vector<std::string> make_docs(size_t n) {
    std::vector<std::string> docs;
    const char* words[] = {"alpha", "beta", "gamma", "delta", "\xce\xbb", "42", "it's", "!"};
    for (size_t d = 0; d < n; ++d) {
        std::string s = "doc " + std::to_string(d) + ":";
        for (size_t w = 0; w < 20 + d % 37; ++w) s += std::string(" ") + words[(d * 7 + w) % 8];
        docs.push_back(s + "\n");
    }
    return docs;
}

std::string jsonl(const std::vector<std::string>& docs, size_t begin, size_t end) {
    std::string out;
    for (size_t d = begin; d < end; ++d) {
        out += nlohmann::json({{"id", d}, {"body", docs[d]}}).dump() + "\n";
    }
    return out;
}

std::string zstd(const std::string& s) {
    std::string out(ZSTD_compressBound(s.size()), '\0');
    out.resize(ZSTD_compress(out.data(), out.size(), s.data(), s.size(), 3));
    return out;
}

struct Corpus {
    std::vector<std::string> docs;
    std::vector<std::string> inputs;
    std::string tokenizer;
};

Corpus make_corpus(const TempDir& tmp) {
    Corpus c;
    c.docs = make_docs(300);
    testing::write_text(tmp.path("a.jsonl"), jsonl(c.docs, 0, 150));
    testing::write_text(tmp.path("b.jsonl.zst"), zstd(jsonl(c.docs, 150, 299)));
    testing::write_text(tmp.path("c.txt"), c.docs[299]);  // plain text: one document
    c.inputs = {tmp.path("a.jsonl"), tmp.path("b.jsonl.zst"), tmp.path("c.txt")};
    BpeTrainer trainer({.vocab_size = 400});
    for (const auto& d : c.docs) trainer.add_text(d);
    c.tokenizer = tmp.path("tokenizer.json");
    trainer.train().save(c.tokenizer);
    return c;
}

PrepareOptions prep_options(const Corpus& c, const std::string& out) {
    PrepareOptions o;
    o.inputs = c.inputs;
    o.tokenizer = c.tokenizer;
    o.out = out;
    o.jsonl_field = "body";
    o.val_fraction = 0.1;
    o.unit_bytes = 1024;
    o.shard_units = 4;
    o.num_threads = 2;
    return o;
}

// Every document of every shard, decoded.
std::vector<std::string> decoded_docs(const std::string& dir, const Tokenizer& tok,
                                      const std::string& split) {
    const Manifest m = Manifest::load(dir);
    std::vector<std::string> out;
    const uint32_t eot = tok.special_id("<|endoftext|>");
    for (const auto& s : m.split(split)) {
        ShardReader r(m.shard_path(s));
        r.verify(s.xxh64);
        for (uint64_t d = 0; d < r.num_docs(); ++d) {
            const uint64_t begin = r.doc_start(d);
            const uint64_t end = d + 1 < r.num_docs() ? r.doc_start(d + 1) : r.num_tokens();
            EXPECT_EQ(r.token(begin), eot);
            std::vector<uint32_t> ids;
            for (uint64_t i = begin + 1; i < end; ++i) ids.push_back(r.token(i));
            out.push_back(tok.decode(ids));
        }
    }
    return out;
}

TEST(Prepare, TextJsonlAndZstdBecomeDocumentsInShards) {
    TempDir tmp("prepare_formats");
    const Corpus c = make_corpus(tmp);
    const auto st = prepare(prep_options(c, tmp.path("out")));
    EXPECT_EQ(st.documents, 300u);
    const Tokenizer tok = Tokenizer::load(c.tokenizer);
    auto train = decoded_docs(tmp.path("out"), tok, "train");
    auto val = decoded_docs(tmp.path("out"), tok, "val");
    EXPECT_FALSE(val.empty());
    EXPECT_GT(train.size(), 5 * val.size());
    std::vector<std::string> all = train;
    all.insert(all.end(), val.begin(), val.end());
    std::sort(all.begin(), all.end());
    std::vector<std::string> want = c.docs;
    std::sort(want.begin(), want.end());
    EXPECT_EQ(all, want);
    const Manifest m = Manifest::load(tmp.path("out"));
    EXPECT_EQ(m.token_bytes, 2u);
    EXPECT_EQ(m.tokenizer_hash, hex64(tok.hash()));
    EXPECT_EQ(m.sources.size(), 3u);
}

TEST(Prepare, InterruptedRunResumesWithoutRedoingShards) {
    TempDir tmp("prepare_resume");
    const Corpus c = make_corpus(tmp);
    prepare(prep_options(c, tmp.path("whole")));

    auto o = prep_options(c, tmp.path("resumed"));
    o.fail_after_shards = 2;
    EXPECT_THROW(prepare(o), IoError);
    EXPECT_FALSE(fs::exists(tmp.path("resumed/manifest.json")));
    std::vector<std::pair<std::string, ino_t>> first;
    for (const auto& e : fs::directory_iterator(tmp.path("resumed"))) {
        if (e.path().extension() == ".bin") {
            struct stat st {};
            ::stat(e.path().c_str(), &st);
            first.emplace_back(e.path().string(), st.st_ino);
        }
    }
    ASSERT_EQ(first.size(), 2u);
    // A crash mid-write leaves only a .tmp file, which is never taken as a shard.
    testing::write_text(tmp.path("resumed/train_000005.bin.tmp"), "partial");

    o.fail_after_shards = -1;
    const auto st = prepare(o);
    EXPECT_EQ(st.shards_skipped, 2u);
    for (const auto& [path, ino] : first) {
        struct stat s {};
        ::stat(path.c_str(), &s);
        EXPECT_EQ(s.st_ino, ino) << path << " was rewritten";
    }
    const Manifest whole = Manifest::load(tmp.path("whole"));
    const Manifest resumed = Manifest::load(tmp.path("resumed"));
    ASSERT_EQ(whole.shards.size(), resumed.shards.size());
    for (size_t k = 0; k < whole.shards.size(); ++k) {
        EXPECT_EQ(whole.shards[k].file, resumed.shards[k].file);
        EXPECT_EQ(whole.shards[k].xxh64, resumed.shards[k].xxh64);
    }
    EXPECT_TRUE(prepare(o).already_complete);
    auto changed = o;
    changed.val_fraction = 0.2;
    EXPECT_THROW(prepare(changed), ConfigError);
}

TEST(Prepare, BadJsonlLineIsNamedByFileAndLine) {
    TempDir tmp("prepare_badjsonl");
    Corpus c = make_corpus(tmp);
    testing::write_text(tmp.path("bad.jsonl"),
                        "{\"body\": \"ok\"}\n{\"body\": \"ok\"}\n{\"body\": nope}\n");
    auto o = prep_options(c, tmp.path("out"));
    o.inputs = {tmp.path("bad.jsonl")};
    try {
        prepare(o);
        FAIL() << "no error";
    } catch (const DataError& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("bad.jsonl' line 3"), std::string::npos) << msg;
    }
    testing::write_text(tmp.path("nofield.jsonl"), "{\"text\": \"ok\"}\n");
    o.inputs = {tmp.path("nofield.jsonl")};
    o.out = tmp.path("out2");
    EXPECT_THROW(prepare(o), DataError);
}

TEST(Prepare, LargeVocabularyUsesUint32Tokens) {
    TempDir tmp("prepare_u32");
    std::vector<std::string> vocab;
    for (int b = 0; b < 256; ++b) vocab.emplace_back(1, static_cast<char>(b));
    while (vocab.size() < 70000) vocab.push_back("tok" + std::to_string(vocab.size()));
    vocab.push_back("<|endoftext|>");
    const Tokenizer tok(vocab, {}, {{"<|endoftext|>", 70000}});
    tok.save(tmp.path("tokenizer.json"));
    testing::write_text(tmp.path("t.txt"), "hello");
    PrepareOptions o;
    o.inputs = {tmp.path("t.txt")};
    o.tokenizer = tmp.path("tokenizer.json");
    o.out = tmp.path("out");
    o.val_fraction = 0;
    prepare(o);
    const Manifest m = Manifest::load(tmp.path("out"));
    ASSERT_EQ(m.shards.size(), 1u);
    EXPECT_EQ(m.token_bytes, 4u);
    ShardReader r(m.shard_path(m.shards[0]));
    EXPECT_EQ(r.num_tokens(), 6u);
    EXPECT_EQ(r.token(0), 70000u);
}

// A plain-text document larger than a unit is cut at pre-token boundaries, so
// its tokens equal those of encoding the whole text; text with no such
// boundary (no spaces) is still cut, and still round-trips.
TEST(Prepare, LongTextDocumentsStreamInBlocks) {
    TempDir tmp("prepare_long");
    Corpus c = make_corpus(tmp);
    std::string prose;
    for (const auto& d : c.docs) prose += d;
    const std::string solid(20000, 'x');
    testing::write_text(tmp.path("prose.txt"), prose);
    testing::write_text(tmp.path("solid.txt"), solid);
    const Tokenizer tok = Tokenizer::load(c.tokenizer);
    for (const auto& [name, text] : {std::pair{"prose", prose}, std::pair{"solid", solid}}) {
        auto o = prep_options(c, tmp.path(std::string("out_") + name));
        o.inputs = {tmp.path(std::string(name) + ".txt")};
        o.val_fraction = 0;
        prepare(o);
        const Manifest m = Manifest::load(o.out);
        std::vector<uint32_t> ids;
        for (const auto& s : m.shards) {
            ShardReader r(m.shard_path(s));
            for (uint64_t i = 0; i < r.num_tokens(); ++i) ids.push_back(r.token(i));
        }
        ASSERT_FALSE(ids.empty());
        EXPECT_EQ(ids[0], tok.special_id("<|endoftext|>"));
        ids.erase(ids.begin());
        EXPECT_EQ(tok.decode(ids), text) << name;
        if (std::string(name) == "prose") {
            EXPECT_EQ(ids, tok.encode(text, false));
        }
    }
}

// The message of the DataError prepare(o) throws ("" when none).
std::string prepare_error(const PrepareOptions& o) {
    try {
        prepare(o);
    } catch (const DataError& e) {
        return e.what();
    }
    return "";
}

TEST(Prepare, EmptyMissingAndDeviceInputsAreNamed) {
    TempDir tmp("prepare_inputs");
    const Corpus c = make_corpus(tmp);
    testing::write_text(tmp.path("empty.txt"), "");
    fs::create_directories(tmp.path("dir"));
    const std::vector<std::pair<std::string, std::string>> cases = {
        {"/dev/null", "is empty"},
        {tmp.path("empty.txt"), "is empty"},
        {tmp.path("absent.txt"), "does not exist"},
        {tmp.path("dir"), "is a directory"}};
    for (const auto& [input, why] : cases) {
        auto o = prep_options(c, tmp.path("out"));
        o.inputs = {c.inputs[0], input};
        const std::string msg = prepare_error(o);
        EXPECT_NE(msg.find(fmt::format("prepare: input '{}' {}", input, why)), std::string::npos)
            << msg;
    }
}

// Unit 0 always goes to validation: an input of one unit has no train tokens.
// That fails, and leaves no manifest.json (which would mark the directory as
// a complete dataset); a train split smaller than validation warns.
TEST(Prepare, NoTrainTokensFailsAndLeavesNoManifest) {
    TempDir tmp("prepare_notrain");
    const Corpus c = make_corpus(tmp);
    testing::write_text(tmp.path("small.txt"), c.docs[0]);
    auto o = prep_options(c, tmp.path("out"));
    o.inputs = {tmp.path("small.txt")};
    const std::string msg = prepare_error(o);
    EXPECT_NE(msg.find(fmt::format("prepare: no train tokens: the input ({} bytes) made 1 unit of "
                                   "up to 1024 bytes and the validation split took 1",
                                   c.docs[0].size())),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("validation fraction of 0"), std::string::npos) << msg;
    EXPECT_FALSE(fs::exists(tmp.path("out/manifest.json")));
    EXPECT_EQ(prepare_error(o), msg);  // a re-run does not take the directory for complete

    std::string text;
    while (text.size() < 1500) text += c.docs[text.size() % 50] + " ";
    testing::write_text(tmp.path("lopsided.txt"), text);
    o.inputs = {tmp.path("lopsided.txt")};
    o.out = tmp.path("out2");
    o.val_fraction = 0.5;  // unit 0 (1024 bytes) to val, unit 1 (the rest) to train
    const PrepareStats st = prepare(o);
    ASSERT_EQ(st.warnings.size(), 1u);
    EXPECT_NE(st.warnings[0].find(fmt::format("only {} train tokens against {} validation tokens",
                                              st.train_tokens, st.val_tokens)),
              std::string::npos)
        << st.warnings[0];
    EXPECT_TRUE(fs::exists(tmp.path("out2/manifest.json")));
}

TEST(FileIo, UnusableInputsSayWhy) {
    TempDir tmp("file_io_inputs");
    testing::write_text(tmp.path("empty"), "");
    testing::write_text(tmp.path("text"), "x");
    EXPECT_EQ(unusable_input("/dev/null"), "is empty");
    EXPECT_EQ(unusable_input(tmp.path("empty")), "is empty");
    EXPECT_EQ(unusable_input(tmp.path("absent")), "does not exist");
    EXPECT_EQ(unusable_input(tmp.path("")), "is a directory");
    EXPECT_EQ(unusable_input(tmp.path("text")), "");
    EXPECT_EQ(unusable_input("/dev/zero").rfind("is not a regular file", 0), 0u);
}

}  // namespace
}  // namespace apiary::data
