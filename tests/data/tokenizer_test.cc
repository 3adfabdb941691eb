// Byte-level BPE: pre-tokenization, round trips, training, file formats, and
// agreement with tiktoken and Hugging Face's JavaScript tokenizers.

#include "data/tokenizer.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <unordered_map>

#include "bpe_reference.h"
#include "core/error.h"
#include "data/bpe_train.h"
#include "data/file_io.h"
#include "data/pretokenize.h"
#include "data/varied_text.h"
#include "test_util.h"

namespace apiary::data {
namespace {

using testing::TempDir;

std::vector<std::string> pieces(std::string_view s) {
    std::vector<std::string> out;
    for_each_pretoken(s, [&](std::string_view p) { out.emplace_back(p); });
    return out;
}

using V = std::vector<std::string>;

TEST(Pretokenize, MatchesTheGpt2RegexOnHandCheckedCases) {
    EXPECT_EQ(pieces("Hello world"), (V{"Hello", " world"}));
    EXPECT_EQ(pieces("I'm here"), (V{"I", "'m", " here"}));
    EXPECT_EQ(pieces("don't"), (V{"don", "'t"}));
    EXPECT_EQ(pieces("'S"), (V{"'", "S"}));  // contractions are case-sensitive
    EXPECT_EQ(pieces("a  b"), (V{"a", " ", " b"}));
    EXPECT_EQ(pieces("a\n\nb"), (V{"a", "\n", "\n", "b"}));
    EXPECT_EQ(pieces("x   "), (V{"x", "   "}));
    EXPECT_EQ(pieces("123abc !!!?"), (V{"123", "abc", " !!!?"}));
    EXPECT_EQ(pieces("caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87"),
              (V{"caf\xc3\xa9", " \xe4\xb8\xad\xe6\x96\x87"}));
    // An invalid byte is its own "other" character and joins a punctuation run.
    EXPECT_EQ(pieces("a\xff!b"), (V{"a", "\xff!", "b"}));
}

Tokenizer gpt2() { return Tokenizer::load_gpt2(testing::gpt2_vocab(), testing::gpt2_merges()); }

TEST(Tokenizer, RoundTripsRandomBytesIncludingInvalidUtf8) {
    const Tokenizer tok = gpt2();
    std::mt19937_64 rng(7);
    for (int trial = 0; trial < 200; ++trial) {
        std::string s(rng() % 300, '\0');
        for (auto& c : s) {
            // Half the strings favour ASCII so that merges actually fire.
            c = static_cast<char>(trial % 2 ? rng() % 256 : 32 + rng() % 96);
        }
        const auto ids = tok.encode(s);
        ASSERT_EQ(tok.decode(ids), s) << "trial " << trial;
    }
    // One long piece takes the heap merge path.
    const std::string long_word(5000, 'a');
    EXPECT_EQ(tok.decode(tok.encode(long_word)), long_word);
}

TEST(Tokenizer, Gpt2KnownIds) {
    const Tokenizer tok = gpt2();
    // "Hello world" and <|endoftext|> as every GPT-2 implementation encodes them.
    EXPECT_EQ(tok.encode("Hello world"), (std::vector<uint32_t>{15496, 995}));
    EXPECT_EQ(tok.encode("<|endoftext|>"), (std::vector<uint32_t>{50256}));
    EXPECT_NE(tok.encode("<|endoftext|>", /*allow_special=*/false).size(), 1u);
    EXPECT_EQ(tok.special_id("<|endoftext|>"), 50256u);
}

TEST(Tokenizer, ParallelEncodeEqualsSequential) {
    const Tokenizer tok = gpt2();
    std::string text;
    std::mt19937_64 rng(3);
    const char* words[] = {"the ",          "quick ",        "brown\n", "fox's ", "  jumps",
                           "<|endoftext|>", "\xe4\xb8\xad ", "42 ",     "!!",     "a"};
    while (text.size() < (3u << 20)) text += words[rng() % 10];
    EXPECT_EQ(tok.encode(text, true, 4), tok.encode(text, true, 1));
}

// ---- text whose words rarely repeat (the encoder's uncached path) ----------

TEST(VariedText, SameSeedGivesTheSameBytesOtherSeedsOthers) {
    const std::string a = varied_text(5, 100000);
    EXPECT_EQ(varied_text(5, 100000), a);
    EXPECT_NE(varied_text(6, 100000), a);
    EXPECT_GE(a.size(), 100000u);
    EXPECT_LT(a.size(), 101000u);
}

TEST(VariedText, HasManyScriptsLongIdentifiersAndFewRepeatedWords) {
    const std::string t = varied_text(1, 1 << 20);
    // Valid UTF-8, and characters from Latin and nine other scripts.
    const std::vector<std::pair<uint32_t, uint32_t>> scripts = {
        {0x41, 0x7A},   {0x430, 0x44F}, {0x3B1, 0x3C9},   {0x628, 0x63A},   {0x5D0, 0x5EA},
        {0x915, 0x939}, {0xE01, 0xE2E}, {0xAC00, 0xD7A3}, {0x4E00, 0x9FA5}, {0x30A1, 0x30FA}};
    std::vector<size_t> seen(scripts.size());
    for (size_t i = 0; i < t.size();) {
        CharClass cls;
        uint32_t cp = 0;
        i += next_char(t, i, &cls, &cp);
        ASSERT_NE(cp, 0xFFFFFFFFu) << "invalid UTF-8 at byte " << i;
        for (size_t k = 0; k < scripts.size(); ++k)
            seen[k] += cp >= scripts[k].first && cp <= scripts[k].second;
    }
    for (size_t k = 0; k < scripts.size(); ++k) EXPECT_GT(seen[k], 1000u) << "script " << k;
    // Most word-like pre-tokens occur once; some are longer than 100 bytes
    // (the encoder's heap path).
    std::unordered_map<std::string_view, int> count;
    size_t words = 0, longest = 0;
    for_each_pretoken(t, [&](std::string_view p) {
        if (p.size() < 6) return;
        ++words;
        ++count[p];
        longest = std::max(longest, p.size());
    });
    size_t once = 0;
    for (const auto& [p, n] : count) once += n == 1;
    EXPECT_GT(double(once) / double(words), 0.6);
    EXPECT_GT(longest, 100u);
}

// The fast encoder against the plain one, on several seeds: every pre-token
// is new to the cache, long identifiers take the heap path.
TEST(Tokenizer, Gpt2EncodesVariedTextLikeTheReference) {
    const Tokenizer tok = gpt2();
    const testing::ReferenceEncoder ref(tok);
    for (uint64_t seed : {1, 2, 3}) {
        const std::string text = varied_text(seed, 120000);
        EXPECT_EQ(tok.encode(text, false, 1), ref.encode(text)) << "seed " << seed;
    }
}

// Runs of one letter are where equal-rank pairs overlap ("aaa": which "aa"
// merges first matters), at every length, through both merge paths (the
// heap takes pieces longer than 64 bytes).
TEST(Tokenizer, RepeatedLettersMergeLeftmostFirstAtEveryLength) {
    const Tokenizer tok = gpt2();
    const testing::ReferenceEncoder ref(tok);
    for (const std::string_view unit : {"a", "e", "ab", "aab", "0", "=", " "}) {
        for (size_t n = 1; n <= 200; ++n) {
            std::string word = "x";
            for (size_t k = 0; k < n; ++k) word += unit[k % unit.size()];
            ASSERT_EQ(tok.encode(word, false, 1), ref.encode(word)) << "'" << unit << "' x " << n;
        }
    }
}

// The text must be able to catch an encoder that merges in the wrong order.
TEST(Tokenizer, VariedTextCatchesAWrongMergeOrder) {
    const Tokenizer tok = gpt2();
    const testing::ReferenceEncoder ref(tok);
    const std::string text = varied_text(4, 120000);
    const auto right = ref.encode(text);
    EXPECT_NE(ref.encode(text, testing::MergeOrder::lowest_rank_rightmost), right);
    EXPECT_NE(ref.encode(text, testing::MergeOrder::leftmost_mergeable), right);
}

// Merged ids that do not follow the merge order (a vocabulary renumbered):
// the encoder then reads each merge's result instead of computing it.
TEST(Tokenizer, RenumberedVocabularyEncodesLikeTheReference) {
    BpeTrainer trainer({.vocab_size = 1000, .specials = {"<|endoftext|>"}});
    trainer.add_text(varied_text(7, 150000));
    const Tokenizer trained = trainer.train();
    // Reverse the ids of the merged tokens (256 .. vocab - 2; the special stays last).
    const uint32_t first = 256, last = uint32_t(trained.vocab_size()) - 2;
    auto renumber = [&](uint32_t id) { return id >= first && id <= last ? first + last - id : id; };
    std::vector<std::string> vocab(trained.vocab_size());
    for (uint32_t id = 0; id < vocab.size(); ++id) vocab[renumber(id)] = trained.token_bytes(id);
    std::vector<Merge> merges;
    for (const auto& m : trained.merges())
        merges.push_back({renumber(m.left), renumber(m.right), renumber(m.result)});
    const Tokenizer tok(vocab, merges, trained.specials());
    const std::string text = varied_text(8, 120000);
    const auto ids = tok.encode(text, false, 1);
    EXPECT_EQ(ids, testing::reference_encode(tok, text));
    EXPECT_EQ(tok.decode(ids), text);
    auto back = trained.encode(text, false, 1);
    for (auto& id : back) id = renumber(id);
    EXPECT_EQ(ids, back);
}

TEST(Tokenizer, VocabularyPastTheEncodersLimitIsRefused) {
    std::vector<std::string> vocab;
    for (int b = 0; b < 256; ++b) vocab.emplace_back(1, char(b));
    while (vocab.size() < (size_t(1) << 21)) vocab.push_back(fmt::format("t{}", vocab.size()));
    try {
        Tokenizer tok(vocab, {}, {});
        FAIL() << "a vocabulary of 2^21 ids was accepted";
    } catch (const DataError& e) {
        EXPECT_NE(std::string(e.what()).find("2097152 ids; apiary's BPE encoder supports "
                                             "vocabularies of up to 2097151 ids"),
                  std::string::npos)
            << e.what();
    }
}

TEST(Tokenizer, ParallelEncodeOfVariedTextEqualsSequential) {
    const Tokenizer tok = gpt2();
    const std::string text = varied_text(9, 3 << 20);
    EXPECT_EQ(tok.encode(text, false, 4), tok.encode(text, false, 1));
}

TEST(BpeTrain, ReproducesHandCheckedMerges) {
    // Pre-tokens "abab", " abab", " ab". Pair counts: (a,b)=5, (b,a)=2,
    // (' ',a)=2 -> merge ab. Then (' ',ab)=2 ties (ab,ab)=2 and wins on the
    // smaller ids; then (ab,ab)=1 ties (' ab',ab)=1 and wins the same way.
    BpeTrainer trainer({.vocab_size = 261, .specials = {"<|endoftext|>"}, .num_threads = 2});
    trainer.add_text("abab abab ab<|endoftext|>");
    const Tokenizer tok = trainer.train();
    ASSERT_EQ(tok.merges().size(), 4u);
    std::vector<std::pair<std::string, std::string>> got;
    for (const auto& m : tok.merges())
        got.emplace_back(tok.token_bytes(m.left), tok.token_bytes(m.right));
    const std::vector<std::pair<std::string, std::string>> want = {
        {"a", "b"}, {" ", "ab"}, {"ab", "ab"}, {" ab", "ab"}};
    EXPECT_EQ(got, want);
    EXPECT_EQ(tok.vocab_size(), 261u);
    EXPECT_EQ(tok.special_id("<|endoftext|>"), 260u);
    EXPECT_EQ(tok.encode(" abab"), (std::vector<uint32_t>{259}));
    // Equal ranks merge leftmost first: ab ab ab -> abab ab.
    EXPECT_EQ(tok.encode("ababab"), (std::vector<uint32_t>{258, 256}));
}

TEST(BpeTrain, ThreadCountDoesNotChangeTheResult) {
    std::string text;
    std::mt19937_64 rng(11);
    const char* syl[] = {"ka", "lo", "mi", "ne", "su", " ", " ", ".", "\n"};
    while (text.size() < 200000) text += syl[rng() % 9];
    BpeTrainer one({.vocab_size = 600, .specials = {"<|endoftext|>"}, .num_threads = 1});
    BpeTrainer two({.vocab_size = 600, .specials = {"<|endoftext|>"}, .num_threads = 2});
    one.add_text(text);
    two.add_text(text);
    EXPECT_EQ(one.train().hash(), two.train().hash());
}

TEST(Tokenizer, SaveLoadRoundTrip) {
    TempDir tmp("tok_save");
    BpeTrainer trainer({.vocab_size = 300});
    trainer.add_text("some words, some more words; and numbers 1234 \xe2\x82\xac \xff\xfe");
    const Tokenizer tok = trainer.train();
    tok.save(tmp.path("tokenizer.json"));
    const Tokenizer back = Tokenizer::load(tmp.path("tokenizer.json"));
    EXPECT_EQ(back.hash(), tok.hash());
    const std::string s = "some numbers 1234 \xe2\x82\xac<|endoftext|>more";
    EXPECT_EQ(back.encode(s), tok.encode(s));
}

TEST(Tokenizer, Gpt2FilesConvertToTokenizerJsonAndBack) {
    const Tokenizer tok = gpt2();
    const Tokenizer back = Tokenizer::from_json_text(tok.to_json_text(), "gpt2.json");
    EXPECT_EQ(back.hash(), tok.hash());
    EXPECT_EQ(back.vocab_size(), 50257u);
    EXPECT_EQ(back.special_id("<|endoftext|>"), 50256u);
}

void expect_data_error(const std::string& json, const std::string& needle) {
    try {
        Tokenizer::from_json_text(json, "bad.json");
        ADD_FAILURE() << "no error; expected one containing '" << needle << "'";
    } catch (const DataError& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("bad.json"), std::string::npos) << msg;
        EXPECT_NE(msg.find(needle), std::string::npos) << msg;
    }
}

TEST(Tokenizer, MalformedTokenizerJsonGivesClearErrors) {
    BpeTrainer trainer({.vocab_size = 260});
    trainer.add_text("hello hello");
    const std::string good = trainer.train().to_json_text();
    expect_data_error(good.substr(0, good.size() / 2), "not valid JSON at byte");
    expect_data_error("{\"version\": \"1.0\"}", "no 'model' object");
    expect_data_error("{\"model\": {\"type\": \"Unigram\", \"vocab\": {}}}", "only BPE");
    expect_data_error("{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": []}}", "byte 0x00");
    std::string bad_merge = good;
    bad_merge.replace(bad_merge.find("\"merges\": [") + 11, 0, "\n  \"zz qq\",");
    expect_data_error(bad_merge, "merge 0");
    std::string bad_id = good;
    bad_id.replace(bad_id.find("\"vocab\": {") + 10, 0, "\"qqqqqqqqq\": \"seven\",");
    expect_data_error(bad_id, "not an integer");
}

TEST(Tokenizer, ATokenizerFileThatIsADeviceOrHugeIsRefusedUnread) {
    namespace fs = std::filesystem;
    TempDir tmp("tokenizer_hostile");
    fs::create_symlink("/dev/null", tmp.path("dev.json"));
    auto error_of = [](const std::string& path) -> std::string {
        try {
            Tokenizer::load(path);
        } catch (const IoError& e) {
            return e.what();
        } catch (const DataError& e) {
            return e.what();
        }
        ADD_FAILURE() << path << " was accepted";
        return "";
    };
    std::string msg = error_of(tmp.path("dev.json"));
    EXPECT_NE(msg.find("tokenizer file '" + tmp.path("dev.json") + "' is not a regular file"),
              std::string::npos)
        << msg;
    { std::ofstream(tmp.path("big.json")) << "{"; }
    fs::resize_file(tmp.path("big.json"), kMaxTokenizerBytes + 1);  // sparse
    msg = error_of(tmp.path("big.json"));
    EXPECT_NE(msg.find(fmt::format("has {} bytes, more than the {} bytes", kMaxTokenizerBytes + 1,
                                   kMaxTokenizerBytes)),
              std::string::npos)
        << msg;
}

}  // namespace
}  // namespace apiary::data
