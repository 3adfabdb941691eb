// apiary's BPE against its peers, run under node (tools/peers): tiktoken's
// `gpt2` encoding with GPT-2's own vocabulary, and Hugging Face's JavaScript
// tokenizers loading a tokenizer.json that apiary trained.

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unicode/uchar.h>

#include <random>

#include "bpe_reference.h"
#include "data/bpe_train.h"
#include "data/tokenizer.h"
#include "data/varied_text.h"
#include "test_util.h"

namespace apiary::data {
namespace {

using testing::TempDir;

Tokenizer gpt2() { return Tokenizer::load_gpt2(testing::gpt2_vocab(), testing::gpt2_merges()); }

// Shows the tokens around a difference, escaped, so a failure explains itself.
std::string context(const Tokenizer& tok, const std::vector<uint32_t>& ids, size_t i) {
    std::string out;
    for (size_t k = i >= 4 ? i - 4 : 0; k < std::min(ids.size(), i + 5); ++k) {
        out += "[";
        for (unsigned char c : tok.token_bytes(ids[k])) {
            out += (c >= 0x20 && c < 0x7F) ? std::string(1, static_cast<char>(c))
                                           : fmt::format("\\x{:02x}", c);
        }
        out += "]";
    }
    return out;
}

void expect_same_ids(const Tokenizer& tok, const std::vector<uint32_t>& ours,
                     const std::vector<uint32_t>& theirs) {
    for (size_t i = 0; i < std::min(ours.size(), theirs.size()); ++i) {
        ASSERT_EQ(ours[i], theirs[i])
            << "first difference at token " << i << "\n  ours:   " << context(tok, ours, i)
            << "\n  theirs: " << context(tok, theirs, i);
    }
    ASSERT_EQ(ours.size(), theirs.size());
}

TEST(TokenizerPeers, Gpt2EqualsTiktokenOnTheWholeBible) {
    const std::string peers = testing::peers_dir();
    TempDir tmp("tok_tiktoken_kjv");
    const std::string kjv = testing::kjv_path();
    testing::run_or_fail("node '" + peers + "/tiktoken_encode.mjs' '" + kjv + "' '" +
                         tmp.path("ids.u32") + "'");
    const Tokenizer tok = gpt2();
    expect_same_ids(tok, tok.encode(testing::read_file_text(kjv), false),
                    testing::read_u32(tmp.path("ids.u32")));
}

std::string random_unicode(uint64_t seed, size_t n) {
    std::mt19937_64 rng(seed);
    auto put = [](uint32_t cp, std::string& out) {
        if (cp < 0x80) {
            out += static_cast<char>(cp);
        } else if (cp < 0x800) {
            out += static_cast<char>(0xC0 | (cp >> 6));
            out += static_cast<char>(0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
            out += static_cast<char>(0xE0 | (cp >> 12));
            out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
            out += static_cast<char>(0x80 | (cp & 0x3F));
        } else {
            out += static_cast<char>(0xF0 | (cp >> 18));
            out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
            out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
            out += static_cast<char>(0x80 | (cp & 0x3F));
        }
    };
    const uint32_t spaces[] = {' ', ' ', '\n', '\t', '\r', 0xA0, 0x2003, 0x3000, 0x85, 0x2028};
    const char* contractions[] = {"'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'"};
    std::string out;
    for (size_t i = 0; i < n; ++i) {
        const uint64_t kind = rng() % 16;
        uint32_t cp;
        if (kind < 5) {
            cp = 0x20 + rng() % 0x5F;  // printable ASCII
        } else if (kind < 8) {
            cp = spaces[rng() % 10];
        } else if (kind == 8) {
            out += contractions[rng() % 9];
            continue;
        } else {
            // Code points assigned in ICU's Unicode version (15.0 on Debian 12):
            // tiktoken's Rust regex knows Unicode 16, whose new letters apiary
            // classes as "other" (docs/data.md).
            do {
                if (kind < 11) {
                    cp = 0xA0 + rng() % 0x2000;  // Latin, Greek, Cyrillic, ..., marks
                } else if (kind < 13) {
                    cp = 0x3000 + rng() % 0x7000;  // CJK, kana, hangul
                } else if (kind == 13) {
                    cp = 0x1F300 + rng() % 0x300;  // emoji
                } else {
                    cp = static_cast<uint32_t>(rng() % 0x110000);
                }
            } while ((cp >= 0xD800 && cp < 0xE000) ||
                     u_charType(static_cast<UChar32>(cp)) == U_UNASSIGNED);
        }
        put(cp, out);
    }
    return out;
}

TEST(TokenizerPeers, Gpt2EqualsTiktokenOnRandomUnicode) {
    const std::string peers = testing::peers_dir();
    TempDir tmp("tok_tiktoken_unicode");
    const std::string text = random_unicode(2026, 200000);
    testing::write_text(tmp.path("text.txt"), text);
    testing::run_or_fail("node '" + peers + "/tiktoken_encode.mjs' '" + tmp.path("text.txt") +
                         "' '" + tmp.path("ids.u32") + "'");
    const Tokenizer tok = gpt2();
    expect_same_ids(tok, tok.encode(text, false), testing::read_u32(tmp.path("ids.u32")));
}

std::vector<uint32_t> tiktoken_ids(const TempDir& tmp, const std::string& text) {
    testing::write_text(tmp.path("text.txt"), text);
    testing::run_or_fail("node '" + testing::peers_dir() + "/tiktoken_encode.mjs' '" +
                         tmp.path("text.txt") + "' '" + tmp.path("ids.u32") + "'");
    return testing::read_u32(tmp.path("ids.u32"));
}

// Text whose words rarely repeat (invented words and names, identifiers up to
// a few hundred bytes, nine other scripts): almost every pre-token goes
// through the merge loop rather than the cache. Several seeds.
TEST(TokenizerPeers, Gpt2EqualsTiktokenOnVariedText) {
    TempDir tmp("tok_tiktoken_varied");
    const Tokenizer tok = gpt2();
    for (uint64_t seed : {1, 2, 3, 4}) {
        SCOPED_TRACE("seed " + std::to_string(seed));
        const std::string text = varied_text(seed, 400000);
        expect_same_ids(tok, tok.encode(text, false, 1), tiktoken_ids(tmp, text));
    }
}

// Encoders that merge in a wrong order disagree with tiktoken on this text,
// so the test above would catch them.
TEST(TokenizerPeers, VariedTextTellsWrongMergeOrdersFromTiktoken) {
    TempDir tmp("tok_tiktoken_wrong");
    const Tokenizer tok = gpt2();
    const testing::ReferenceEncoder ref(tok);
    const std::string text = varied_text(5, 200000);
    const auto theirs = tiktoken_ids(tmp, text);
    EXPECT_EQ(ref.encode(text), theirs);
    EXPECT_NE(ref.encode(text, testing::MergeOrder::lowest_rank_rightmost), theirs);
    EXPECT_NE(ref.encode(text, testing::MergeOrder::leftmost_mergeable), theirs);
}

TEST(TokenizerPeers, TrainedOnVariedTextEncodesTheSameInHuggingFaceJs) {
    const std::string peers = testing::peers_dir();
    TempDir tmp("tok_hfjs_varied");
    BpeTrainer trainer({.vocab_size = 4096});
    trainer.add_text(varied_text(6, 1 << 20));
    const Tokenizer tok = trainer.train();
    tok.save(tmp.path("tokenizer.json"));
    const std::string text = varied_text(7, 400000);
    testing::write_text(tmp.path("text.txt"), text);
    testing::run_or_fail("node '" + peers + "/hf_encode.mjs' '" + tmp.path("tokenizer.json") +
                         "' '" + tmp.path("text.txt") + "' '" + tmp.path("ids.u32") + "'");
    expect_same_ids(tok, tok.encode(text, false, 1), testing::read_u32(tmp.path("ids.u32")));
}

TEST(TokenizerPeers, TrainedTokenizerJsonEncodesTheSameInHuggingFaceJs) {
    const std::string peers = testing::peers_dir();
    TempDir tmp("tok_hfjs");
    const std::string kjv = testing::kjv_path();
    const std::string text = testing::read_file_text(kjv);
    BpeTrainer trainer({.vocab_size = 4096});
    trainer.add_text(text);
    const Tokenizer tok = trainer.train();
    tok.save(tmp.path("tokenizer.json"));
    testing::run_or_fail("node '" + peers + "/hf_encode.mjs' '" + tmp.path("tokenizer.json") +
                         "' '" + kjv + "' '" + tmp.path("ids.u32") + "'");
    expect_same_ids(tok, tok.encode(text, false), testing::read_u32(tmp.path("ids.u32")));
}

TEST(TokenizerPeers, Gpt2AsTokenizerJsonEncodesTheBibleInHuggingFaceJsLikeTiktoken) {
    const std::string peers = testing::peers_dir();
    TempDir tmp("tok_hfjs_gpt2");
    const std::string kjv = testing::kjv_path();
    const Tokenizer tok = gpt2();
    tok.save(tmp.path("gpt2.json"));
    testing::run_or_fail("node '" + peers + "/hf_encode.mjs' '" + tmp.path("gpt2.json") + "' '" +
                         kjv + "' '" + tmp.path("hf.u32") + "'");
    testing::run_or_fail("node '" + peers + "/tiktoken_encode.mjs' '" + kjv + "' '" +
                         tmp.path("tt.u32") + "'");
    const auto hf = testing::read_u32(tmp.path("hf.u32"));
    expect_same_ids(tok, hf, testing::read_u32(tmp.path("tt.u32")));
    expect_same_ids(tok, tok.encode(testing::read_file_text(kjv), false), hf);
}

}  // namespace
}  // namespace apiary::data
