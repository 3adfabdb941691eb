// Loader: shuffle, rank partition, mixture, curriculum, exact resume, and the
// errors for damaged shards. Sources are synthetic shards whose token at
// position p of source s is s * 1e6 + p, so every window names its origin.

#include "data/loader.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "core/error.h"
#include "data/file_io.h"
#include "data/sampler.h"
#include "data/shard.h"
#include "test_util.h"

namespace apiary::data {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

constexpr uint64_t kVocab = 1u << 30;
constexpr char kTokHash[] = "00000000000000aa";

// A source of `shards` shards with `tokens_per_shard` tokens each.
std::string make_source(const TempDir& tmp, const std::string& name, uint32_t source_id, int shards,
                        uint64_t tokens_per_shard, const std::string& split = "train") {
    const std::string dir = tmp.path(name);
    fs::create_directories(dir);
    Manifest m;
    m.dir = dir;
    m.tokenizer_hash = kTokHash;
    m.vocab_size = kVocab;
    m.token_bytes = 4;
    uint64_t p = 0;
    for (int k = 0; k < shards; ++k) {
        std::vector<uint32_t> tokens(tokens_per_shard);
        for (auto& t : tokens) t = static_cast<uint32_t>(source_id * 1000000 + p++);
        const std::string file = fmt::format("{}_{:06d}.bin", split, k);
        const uint64_t h = write_shard(dir + "/" + file, tokens, {0}, 4, 0xaa, kVocab);
        m.shards.push_back(
            {file, split, tokens.size(), 1, fs::file_size(dir + "/" + file), hex64(h)});
    }
    m.save();
    return dir;
}

LoaderOptions options(std::vector<SourceSpec> sources, int64_t B, int64_t T) {
    LoaderOptions o;
    o.sources = std::move(sources);
    o.batch_size = B;
    o.seq_len = T;
    o.seed = 42;
    o.prefetch = 2;
    return o;
}

// The id of each window of a batch: its first token (rows of one window are
// consecutive, so take row 0 of each window).
std::vector<uint32_t> window_ids(const Batch& b, int64_t windows) {
    std::vector<uint32_t> ids;
    const int64_t rows = b.B / windows;
    for (int64_t j = 0; j < windows; ++j) ids.push_back(static_cast<uint32_t>(b.row(j * rows)[0]));
    return ids;
}

TEST(Sampler, PermutationIsABijectionAndDependsOnTheStream) {
    for (uint64_t n : {1, 2, 3, 17, 1000, 4097}) {
        Permutation p(n, 7, 0), q(n, 7, 1);
        std::set<uint64_t> seen;
        bool differs = false;
        for (uint64_t i = 0; i < n; ++i) {
            seen.insert(p(i));
            differs |= p(i) != q(i);
        }
        EXPECT_EQ(seen.size(), n);
        EXPECT_LT(*seen.rbegin(), n);
        if (n >= 17) {
            EXPECT_TRUE(differs) << n;
        }
    }
}

TEST(Sampler, MixtureIsWithinOneSampleOfExactAtEveryPrefix) {
    for (const std::vector<double>& w :
         {std::vector<double>{0.7, 0.2, 0.1}, std::vector<double>{1, 1, 1},
          std::vector<double>{0.5, 0.3, 0.15, 0.05}, std::vector<double>{0.999, 0.001}}) {
        Mixer m(w);
        double sum = 0;
        for (double x : w) sum += x;
        for (uint64_t n = 1; n <= 200000; ++n) {
            m.next();
            for (size_t s = 0; s < w.size(); ++s) {
                const double want = w[s] / sum * double(n);
                ASSERT_LE(std::abs(double(m.drawn()[s]) - want), 1.0)
                    << "source " << s << " after " << n;
            }
        }
    }
}

TEST(Loader, EpochIsAPermutationOfAllWindowsAndDiffersByEpoch) {
    TempDir tmp("loader_perm");
    // 3 shards x 161 tokens at T = 16: 10 windows each, 30 in all.
    const std::string src = make_source(tmp, "a", 0, 3, 161);
    Loader loader(options({{src, 1}}, 5, 16));
    std::vector<uint32_t> epoch0, epoch1;
    for (int step = 0; step < 6; ++step) {
        for (auto id : window_ids(loader.next_batch(), 5)) epoch0.push_back(id);
    }
    for (int step = 0; step < 6; ++step) {
        for (auto id : window_ids(loader.next_batch(), 5)) epoch1.push_back(id);
    }
    std::set<uint32_t> all;
    for (uint64_t w = 0; w < 30; ++w)
        all.insert(static_cast<uint32_t>((w / 10) * 161 + (w % 10) * 16));
    EXPECT_EQ(std::set<uint32_t>(epoch0.begin(), epoch0.end()), all);
    EXPECT_EQ(std::set<uint32_t>(epoch1.begin(), epoch1.end()), all);
    EXPECT_NE(epoch0, epoch1);
    // Each row is a contiguous T + 1 window of the stream.
    const Batch& b = loader.next_batch();
    for (int64_t i = 0; i < b.B; ++i) {
        for (int64_t k = 0; k <= b.T; ++k) ASSERT_EQ(b.row(i)[k], b.row(i)[0] + k);
    }
}

TEST(Loader, RanksAreDisjointAndTogetherCoverTheEpoch) {
    TempDir tmp("loader_ranks");
    const std::string src = make_source(tmp, "a", 0, 2, 30 * 8 + 1);  // 60 windows of T = 8
    std::vector<std::set<uint32_t>> per_rank(3);
    for (int r = 0; r < 3; ++r) {
        auto o = options({{src, 1}}, 2, 8);
        o.dp_rank = r;
        o.dp_size = 3;
        Loader loader(o);
        for (int step = 0; step < 10; ++step) {
            for (auto id : window_ids(loader.next_batch(), 2)) per_rank[r].insert(id);
        }
    }
    std::set<uint32_t> all;
    for (const auto& s : per_rank) {
        EXPECT_EQ(s.size(), 20u);
        all.insert(s.begin(), s.end());
    }
    EXPECT_EQ(all.size(), 60u);
}

TEST(Loader, MixtureProportionsHoldAtEveryStep) {
    TempDir tmp("loader_mix");
    const std::string a = make_source(tmp, "a", 1, 1, 1001);
    const std::string b = make_source(tmp, "b", 2, 1, 1001);
    Loader loader(options({{a, 3}, {b, 1}}, 8, 16));
    uint64_t n = 0, from_b = 0;
    for (int step = 0; step < 100; ++step) {
        const Batch& batch = loader.next_batch();
        for (auto id : window_ids(batch, 8)) {
            ++n;
            from_b += id / 1000000 == 2;
        }
        ASSERT_LE(std::abs(double(from_b) - 0.25 * double(n)), 1.0) << "after step " << step;
    }
}

TEST(Loader, CurriculumLengths) {
    TempDir tmp("loader_curriculum");
    const std::string src = make_source(tmp, "a", 0, 1, 64 * 50 + 1);
    auto o = options({{src, 1}}, 2, 64);
    o.curriculum_start = 16;
    o.curriculum_steps = 4;
    {
        Loader loader(o);  // tokens mode: T rounds down to a divisor of 64, B * T constant
        const std::vector<std::pair<int64_t, int64_t>> want = {{8, 16}, {8, 16}, {4, 32},
                                                               {4, 32}, {2, 64}, {2, 64}};
        for (const auto& [wb, wt] : want) {
            const Batch& b = loader.next_batch();
            EXPECT_EQ(b.B, wb);
            EXPECT_EQ(b.T, wt);
            // The rows of one window tile it: row r starts r * T later.
            for (int64_t i = 1; i < b.B / 2; ++i) EXPECT_EQ(b.row(i)[0], b.row(0)[0] + i * b.T);
        }
        EXPECT_EQ(loader.max_batch_tokens(), 8 * 17);
    }
    o.curriculum_mode = CurriculumMode::batch;
    Loader loader(o);
    for (int64_t want_t : {16, 28, 40, 52, 64, 64}) {
        const Batch& b = loader.next_batch();
        EXPECT_EQ(b.B, 2);
        EXPECT_EQ(b.T, want_t);
    }
}

TEST(Loader, ResumeSeesExactlyTheBatchesOfTheUninterruptedRun) {
    TempDir tmp("loader_resume");
    const std::string a = make_source(tmp, "a", 1, 3, 700);
    const std::string b = make_source(tmp, "b", 2, 2, 500);
    auto o = options({{a, 0.6}, {b, 0.4}}, 3, 32);
    o.curriculum_start = 8;
    o.curriculum_steps = 5;
    o.prefetch = 3;
    std::vector<std::vector<int32_t>> full;
    {
        Loader loader(o);
        for (int i = 0; i < 40; ++i) full.push_back(loader.next_batch().tokens);
    }
    nlohmann::json saved;
    {
        Loader loader(o);
        for (int i = 0; i < 13; ++i) ASSERT_EQ(loader.next_batch().tokens, full[i]);
        saved = nlohmann::json::parse(loader.state().dump());  // as written to a checkpoint
    }
    Loader resumed(o);
    resumed.restore(saved);
    EXPECT_EQ(resumed.step(), 13);
    for (int i = 13; i < 40; ++i) ASSERT_EQ(resumed.next_batch().tokens, full[i]) << "batch " << i;
    // A state from other data is refused.
    auto other = o;
    other.seed = 1;
    Loader wrong(other);
    EXPECT_THROW(wrong.restore(saved), ConfigError);
}

std::string error_of(const LoaderOptions& o) {
    try {
        Loader loader(o);
        // Shards are verified on first use: read past a whole epoch.
        for (int i = 0; i < 20; ++i) loader.next_batch();
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

TEST(Loader, DamagedShardsGiveErrorsNamingFileAndOffset) {
    TempDir tmp("loader_errors");
    const std::string src = make_source(tmp, "a", 0, 2, 200);
    const std::string shard = src + "/train_000001.bin";
    const auto o = options({{src, 1}}, 2, 16);
    const std::string pristine = read_file(shard);

    fs::resize_file(shard, pristine.size() - 3);  // truncated
    std::string msg = error_of(o);
    EXPECT_NE(msg.find("train_000001.bin"), std::string::npos) << msg;
    EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;

    std::string corrupt = pristine;  // one token flipped: checksum mismatch
    corrupt[kShardHeaderBytes + 4 * 10] ^= 0x01;
    write_file_atomic(shard, corrupt);
    msg = error_of(o);
    EXPECT_NE(msg.find("train_000001.bin"), std::string::npos) << msg;
    EXPECT_NE(msg.find("xxh64"), std::string::npos) << msg;

    corrupt = pristine;  // bad magic
    corrupt[0] = 'X';
    write_file_atomic(shard, corrupt);
    msg = error_of(o);
    EXPECT_NE(msg.find("bad magic at byte 0"), std::string::npos) << msg;

    // A token past the vocabulary, with a matching checksum: found by offset.
    corrupt = pristine;
    const uint32_t huge = 0xFFFFFFF0u;
    std::memcpy(corrupt.data() + kShardHeaderBytes + 4 * 7, &huge, 4);
    write_file_atomic(shard, corrupt);
    auto m = Manifest::load(src);
    m.shards[1].xxh64 = hex64(xxhash64(corrupt.data(), corrupt.size()));
    m.save();
    msg = error_of(o);
    EXPECT_NE(msg.find(fmt::format("at byte {}", kShardHeaderBytes + 4 * 7)), std::string::npos)
        << msg;

    fs::remove(shard);  // missing
    msg = error_of(o);
    EXPECT_NE(msg.find("train_000001.bin"), std::string::npos) << msg;
    EXPECT_NE(msg.find("cannot be opened"), std::string::npos) << msg;

    write_file_atomic(shard, pristine);
    m.shards[1].xxh64 = hex64(xxhash64(pristine.data(), pristine.size()));
    m.save();
    auto with_tok = o;
    with_tok.tokenizer_hash = "00000000000000bb";
    msg = error_of(with_tok);
    EXPECT_NE(msg.find("tokenized with tokenizer 00000000000000aa"), std::string::npos) << msg;
    EXPECT_NE(msg.find("manifest.json"), std::string::npos) << msg;
    EXPECT_EQ(error_of(o), "");
}

// data.verify = false skips the checksum and the vocabulary scan; a token
// past the vocabulary must still be named by file and offset (it used to
// reach the model, whose error named neither).
TEST(Loader, WithoutVerifyATokenPastTheVocabularyIsNamedByFileAndOffset) {
    TempDir tmp("loader_noverify");
    const std::string dir = tmp.path("src");
    fs::create_directories(dir);
    Manifest m;
    m.dir = dir;
    m.tokenizer_hash = kTokHash;
    m.vocab_size = 500;
    m.token_bytes = 2;
    std::vector<uint32_t> tokens(400, 7);
    tokens[0] = 900;  // in the first window; the others are fine
    const uint64_t h = write_shard(dir + "/train_000000.bin", tokens, {0}, 2, 0xaa, 500);
    m.shards.push_back({"train_000000.bin", "train", tokens.size(), 1,
                        fs::file_size(dir + "/train_000000.bin"), hex64(h)});
    m.save();
    auto o = options({{dir, 1}}, 1, 16);
    o.shuffle = false;
    std::string msg = error_of(o);
    EXPECT_NE(msg.find("train_000000.bin': token 0 at byte 64 is 900, past the vocabulary size "
                       "500"),
              std::string::npos)
        << msg;
    o.verify = false;
    msg = error_of(o);
    EXPECT_NE(msg.find("train_000000.bin': token 0 at byte 64 is 900, past the vocabulary size "
                       "500 (data.verify = false"),
              std::string::npos)
        << msg;
}

TEST(Loader, ShardHeadersAndSizesMustMatchTheManifest) {
    TempDir tmp("loader_header");
    const std::string src = make_source(tmp, "a", 0, 2, 200);
    const auto o = options({{src, 1}}, 2, 16);
    const Manifest good = Manifest::load(src);
    Manifest m = good;
    m.vocab_size = kVocab - 1;
    m.save();
    std::string msg = error_of(o);
    EXPECT_NE(msg.find(fmt::format("train_000000.bin': vocabulary size {} (header byte 40) "
                                   "differs from the manifest's {}",
                                   kVocab, kVocab - 1)),
              std::string::npos)
        << msg;
    m = good;
    m.shards[1].bytes += 1;
    m.save();
    msg = error_of(o);
    EXPECT_NE(msg.find(fmt::format("train_000001.bin' has {} bytes, the manifest says {}",
                                   good.shards[1].bytes, good.shards[1].bytes + 1)),
              std::string::npos)
        << msg;
    m = good;
    m.shards[0].documents = 3;
    m.save();
    msg = error_of(o);
    EXPECT_NE(msg.find("document count 1 (header byte 24) differs from the manifest's 3"),
              std::string::npos)
        << msg;
}

TEST(Manifest, ShardListedTwiceIsRefused) {
    TempDir tmp("manifest_dup");
    const std::string src = make_source(tmp, "a", 0, 2, 50);
    auto j = nlohmann::json::parse(read_file(src + "/manifest.json"));
    j["shards"].push_back(j["shards"][0]);
    write_file_atomic(src + "/manifest.json", j.dump());
    try {
        Manifest::load(src);
        FAIL() << "a manifest listing a shard twice was accepted";
    } catch (const DataError& e) {
        EXPECT_NE(std::string(e.what()).find("shards[0] and shards[2] both list "
                                             "'train_000000.bin'"),
                  std::string::npos)
            << e.what();
    }
}

// The DataError of loading the manifest of `src`.
std::string manifest_error(const std::string& src) {
    try {
        Manifest::load(src);
    } catch (const DataError& e) {
        return e.what();
    }
    ADD_FAILURE() << src << ": the manifest was accepted";
    return "";
}

TEST(Manifest, AHostileVocabularySizeIsRefusedBeforeItSizesAnything) {
    TempDir tmp("manifest_hostile");
    const std::string src = make_source(tmp, "a", 0, 1, 50);
    const auto good = nlohmann::json::parse(read_file(src + "/manifest.json"));
    auto j = good;
    j["tokenizer"]["vocab_size"] = uint64_t(1) << 50;  // would size the embedding
    write_file_atomic(src + "/manifest.json", j.dump());
    std::string msg = manifest_error(src);
    EXPECT_NE(msg.find("tokenizer.vocab_size 1125899906842624 is outside [1, 2147483648] for "
                       "uint32 tokens"),
              std::string::npos)
        << msg;
}

TEST(Manifest, AManifestThatIsADeviceOrHugeIsRefusedUnread) {
    TempDir tmp("manifest_device");
    fs::create_directories(tmp.path("dev"));
    fs::create_symlink("/dev/null", tmp.path("dev/manifest.json"));
    std::string msg = manifest_error(tmp.path("dev"));
    EXPECT_NE(msg.find("manifest '" + tmp.path("dev/manifest.json") + "' is not a regular file"),
              std::string::npos)
        << msg;
    fs::create_directories(tmp.path("big"));
    { std::ofstream(tmp.path("big/manifest.json")) << "{"; }
    fs::resize_file(tmp.path("big/manifest.json"), kMaxManifestBytes + 1);  // sparse
    msg = manifest_error(tmp.path("big"));
    EXPECT_NE(msg.find(fmt::format("has {} bytes, more than the {} bytes a manifest may have",
                                   kMaxManifestBytes + 1, kMaxManifestBytes)),
              std::string::npos)
        << msg;
}

TEST(Loader, AnUnsupportedSchemeIsNamed) {
    try {
        Loader l(options({{"ftp://host/corpus", 1.0}}, 2, 8));
        FAIL() << "an ftp:// source was accepted";
    } catch (const ConfigError& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("data source 'ftp://host/corpus': the scheme 'ftp' is not supported"),
                  std::string::npos)
            << msg;
    }
}

TEST(Loader, ParsesSourceLists) {
    const auto s = parse_sources("dirA:0.7, /x/y:dirB:0.3,plain");
    ASSERT_EQ(s.size(), 3u);
    EXPECT_EQ(s[0].path, "dirA");
    EXPECT_DOUBLE_EQ(s[0].weight, 0.7);
    EXPECT_EQ(s[1].path, "/x/y:dirB");
    EXPECT_EQ(s[2].path, "plain");
    EXPECT_DOUBLE_EQ(s[2].weight, 1.0);
    EXPECT_THROW(parse_sources("a:0"), ConfigError);
}

TEST(Loader, UnigramMixesTheSourcesByWeight) {
    TempDir tmp("loader_unigram");
    // Vocabulary of 4: source a is 0 0 0 1 repeated, source b 2 3 3 3.
    auto source = [&](const std::string& name, std::vector<uint32_t> pattern) {
        const std::string dir = tmp.path(name);
        fs::create_directories(dir);
        std::vector<uint32_t> tokens;
        for (int i = 0; i < 64; ++i) tokens.insert(tokens.end(), pattern.begin(), pattern.end());
        Manifest m;
        m.dir = dir;
        m.tokenizer_hash = kTokHash;
        m.vocab_size = 4;
        m.token_bytes = 2;
        const uint64_t h = write_shard(dir + "/train_000000.bin", tokens, {0}, 2, 0xaa, 4);
        m.shards.push_back({"train_000000.bin", "train", tokens.size(), 1,
                            fs::file_size(dir + "/train_000000.bin"), hex64(h)});
        m.save();
        return dir;
    };
    const std::string a = source("a", {0, 0, 0, 1}), b = source("b", {2, 3, 3, 3});
    Loader loader(options({{a, 0.75}, {b, 0.25}}, 2, 8));
    const auto p = loader.unigram(1 << 20);
    ASSERT_EQ(p.size(), 4u);
    EXPECT_DOUBLE_EQ(p[0], 0.75 * 0.75);
    EXPECT_DOUBLE_EQ(p[1], 0.75 * 0.25);
    EXPECT_DOUBLE_EQ(p[2], 0.25 * 0.25);
    EXPECT_DOUBLE_EQ(p[3], 0.25 * 0.75);
    // Only the first tokens of each source when capped: a's first three are 0.
    const auto q = loader.unigram(3);
    EXPECT_DOUBLE_EQ(q[0], 0.75);
    EXPECT_DOUBLE_EQ(q[2] + q[3], 0.25);
}

}  // namespace
}  // namespace apiary::data
