#include "train/train_data.h"

#include <fmt/format.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>

#include "core/error.h"
#include "core/timing.h"
#include "data/bpe_train.h"
#include "data/file_io.h"
#include "data/keys.h"
#include "data/prepare.h"
#include "data/remote.h"
#include "data/shard.h"
#include "data/tokenizer.h"

namespace apiary::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Bump when the built-in preparation changes what it writes: old cache
// entries then stop matching instead of being reused.
constexpr int kPrepareVersion = 1;

struct Corpus {
    std::string path;  // a text file (the KJV's lives in the cache)
    std::string hash;  // xxh64 of its bytes, hex
    uint64_t bytes = 0;
    std::string name;  // for messages
};

struct TokenizerChoice {
    data::Tokenizer tok;
    std::string json;  // tokenizer.json text
    std::string what;  // for the banner
};

// A name no other process or call uses: cache entries are built under it
// and renamed into place.
std::string temporary_name(const fs::path& final_path) {
    static std::atomic<int> counter{0};
    return fmt::format("{}.tmp-{}-{}", final_path.string(), ::getpid(), counter++);
}

void publish_file(const fs::path& path, const std::string& text) {
    const std::string tmp = temporary_name(path);
    data::write_file_atomic(tmp, text);
    fs::rename(tmp, path);  // same content whoever wins a race
}

Corpus locate_corpus(const core::Config& c, const fs::path& cache) {
    const std::string spec = c.get_string("data.corpus");
    if (spec == "kjv") {
        const std::string text = read_kjv();
        Corpus k{"", data::hex64(data::xxhash64(text.data(), text.size())), text.size(),
                 "kjv (bible gen1:1-rev22:21)"};
        const fs::path path = cache / ("kjv-" + k.hash + ".txt");
        if (!fs::exists(path)) {
            fs::create_directories(cache);
            publish_file(path, text);
        }
        k.path = path.string();
        return k;
    }
    if (fs::is_directory(spec)) {
        throw DataError(
            fmt::format("data.corpus: '{}' is a directory; give a text file (or "
                        "'kjv'), or set data.sources to directories made by `apiary "
                        "data prepare`",
                        spec));
    }
    if (const std::string why = data::unusable_input(spec); !why.empty()) {
        throw DataError(fmt::format("data.corpus: '{}' {}; give a text file, or 'kjv'", spec, why));
    }
    return {spec, data::hex64(data::xxhash64_file(spec)), uint64_t(fs::file_size(spec)), spec};
}

TokenizerChoice choose_tokenizer(const core::Config& c, const Corpus& corpus, const fs::path& cache,
                                 bool verbose) {
    const std::string kind = c.get_string("data.tokenizer");
    const std::string file = c.get_string("data.tokenizer_file");
    if (kind == "byte") {
        if (!file.empty()) {
            throw ConfigError(
                fmt::format("data.tokenizer = 'byte' but data.tokenizer_file = "
                            "'{}' is set; set data.tokenizer = 'bpe' to use it",
                            file));
        }
        // No merges: the ids are the 256 bytes themselves, then <|endoftext|>.
        data::Tokenizer tok = data::BpeTrainer({.vocab_size = 257}).train();
        std::string text = tok.to_json_text();
        return {std::move(tok), std::move(text), "bytes (256 ids + <|endoftext|>)"};
    }
    if (!file.empty()) {
        return {data::Tokenizer::load(file), data::read_file(file), file};
    }
    const int64_t V = c.get_int("data.bpe_vocab_size");
    const fs::path path = cache / fmt::format("bpe-{}-{}.json", corpus.hash, V);
    if (fs::exists(path)) {
        return {data::Tokenizer::load(path.string()), data::read_file(path.string()),
                fmt::format("BPE of {} tokens trained on it ({})", V, path.string())};
    }
    if (verbose) {
        fmt::print("data: training a byte-level BPE of {} tokens on {} ({:.2f} MB) ... ", V,
                   corpus.name, double(corpus.bytes) / 1e6);
        std::fflush(stdout);
    }
    const auto t0 = std::chrono::steady_clock::now();
    data::Tokenizer tok = data::train_bpe_on_files({corpus.path}, {.vocab_size = size_t(V)});
    std::string text = tok.to_json_text();
    fs::create_directories(cache);
    publish_file(path, text);
    if (verbose) fmt::print("{:.1f} s -> {}\n", core::seconds_since(t0), path.string());
    return {std::move(tok), std::move(text),
            fmt::format("BPE of {} tokens trained on it ({})", V, path.string())};
}

// The prepared shards of corpus under tokenizer, built unless cached.
std::string prepare_corpus(const core::Config& c, const Corpus& corpus, const TokenizerChoice& tok,
                           const fs::path& cache, bool verbose) {
    const double val_fraction = c.get_real("data.val_fraction");
    // Units are the grain of the validation split (docs/data.md): at most
    // 64 KiB, and small enough that a small corpus still holds out about
    // val_fraction of its text rather than one whole unit.
    const size_t unit_bytes =
        size_t(std::clamp<double>(double(corpus.bytes) * val_fraction / 4.0 / 1024.0, 1.0, 64.0)) *
        1024;
    const json key = {{"version", kPrepareVersion},
                      {"corpus", corpus.hash},
                      {"tokenizer", data::hex64(tok.tok.hash())},
                      {"val_fraction", val_fraction},
                      {"unit_bytes", unit_bytes}};
    const std::string dump = key.dump();
    const fs::path dir =
        cache / ("shards-" + data::hex64(data::xxhash64(dump.data(), dump.size())));
    if (fs::exists(dir / "manifest.json")) return dir.string();

    if (verbose) {
        fmt::print("data: tokenizing {} into shards ... ", corpus.name);
        std::fflush(stdout);
    }
    const auto t0 = std::chrono::steady_clock::now();
    const fs::path tmp = temporary_name(dir);
    fs::create_directories(tmp);
    // The tokenizer travels with its shards: the directory describes itself.
    data::write_file_atomic((tmp / "tokenizer.json").string(), tok.json);
    data::PrepareOptions o;
    o.inputs = {corpus.path};
    o.tokenizer = (tmp / "tokenizer.json").string();
    o.out = tmp.string();
    o.val_fraction = val_fraction;
    o.unit_bytes = unit_bytes;
    try {
        data::prepare(o);
    } catch (const DataError& e) {
        std::error_code ec;
        fs::remove_all(tmp, ec);
        throw DataError(fmt::format("data.corpus '{}': {}", corpus.name, e.what()));
    } catch (...) {
        std::error_code ec;
        fs::remove_all(tmp, ec);
        throw;
    }
    std::error_code ec;
    fs::rename(tmp, dir, ec);
    if (ec) {
        // Another run finished the same entry first: the same bytes.
        fs::remove_all(tmp, ec);
        if (!fs::exists(dir / "manifest.json")) {
            throw IoError(
                fmt::format("{}: cannot publish the prepared corpus there", dir.string()));
        }
    }
    if (verbose) fmt::print("{:.1f} s -> {}\n", core::seconds_since(t0), dir.string());
    return dir.string();
}

data::Manifest load_manifest(const data::SourceSpec& s, const core::Config& c) {
    if (data::is_url(s.path))
        return data::ShardCache(data::remote_options_from(c)).manifest(s.path);
    try {
        return data::Manifest::load(s.path);
    } catch (const DataError& e) {
        throw DataError(fmt::format("data.sources: {}", e.what()));
    }
}

// What gives a split a sample: more text or a shorter train.seq_len always;
// the validation fraction moves text between the splits, in the direction
// the split needs (for data.sources it was fixed by `apiary data prepare`).
std::string no_sample_hint(const std::string& split, bool corpus) {
    const bool train = split == "train";
    const std::string fraction =
        corpus ? fmt::format("a {} data.val_fraction", train ? "smaller" : "larger")
               : fmt::format("`apiary data prepare` with a {} --val-fraction",
                             train ? "smaller" : "larger");
    return fmt::format("use more text, {}, or a shorter train.seq_len", fraction);
}

// Windows of T + 1 tokens the loader cuts from a split (shard by shard).
uint64_t windows(const data::Manifest& m, const std::string& split, int64_t T) {
    uint64_t n = 0;
    for (const auto& s : m.split(split)) n += s.tokens > uint64_t(T) ? (s.tokens - 1) / T : 0;
    return n;
}

}  // namespace

std::string read_kjv() {
    // `bible` prints the requested verses; Genesis 1:1 to Revelation 22:21 is all of it.
    FILE* p = ::popen("bible gen1:1-rev22:21 2>/dev/null", "r");
    std::string text;
    if (p) {
        std::array<char, 1 << 16> buf;
        size_t n;
        while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) text.append(buf.data(), n);
        const int rc = ::pclose(p);
        if (rc != 0) text.clear();
    }
    if (text.size() < 1000000) {
        throw DataError(
            "data.corpus = 'kjv': the `bible` command (Debian packages bible-kjv and "
            "bible-kjv-text) is missing or printed nothing; run scripts/install-deps.sh, or set "
            "data.corpus to a text file");
    }
    return text;
}

TrainData resolve_train_data(const core::Config& c, bool verbose) {
    TrainData d;
    const std::string tokenizer_file = c.get_string("data.tokenizer_file");
    std::optional<data::Tokenizer> file_tok;
    if (!tokenizer_file.empty()) file_tok = data::Tokenizer::load(tokenizer_file);
    std::string corpus_name;
    if (!c.get_string("data.sources").empty()) {
        if (c.get_string("data.tokenizer") == "byte") {
            throw ConfigError(
                "data.tokenizer = 'byte' applies to data.corpus, but data.sources "
                "is set: shards carry their own tokenizer (name its file with "
                "data.tokenizer_file); unset one of them");
        }
        d.sources = data::parse_sources(c.get_string("data.sources"));
        if (file_tok) d.tokenizer_json = data::read_file(tokenizer_file);
    } else {
        const fs::path cache = c.get_string("data.cache_dir");
        const Corpus corpus = locate_corpus(c, cache);
        const TokenizerChoice tok = choose_tokenizer(c, corpus, cache, verbose);
        d.sources = {{prepare_corpus(c, corpus, tok, cache, verbose), 1.0}};
        d.tokenizer_json = tok.json;
        corpus_name = fmt::format("data.corpus '{}'", c.get_string("data.corpus"));
        d.description = fmt::format("{}, {:.2f} MB, tokenized as {}", corpus.name,
                                    double(corpus.bytes) / 1e6, tok.what);
    }
    if (d.sources.empty()) throw ConfigError("data.sources names no directory");

    // Every manifest: present, one tokenizer, and data.tokenizer_file's.
    const int64_t T = c.get_int("train.seq_len");
    uint64_t bytes = 0, tokens = 0;
    std::string first;
    for (const auto& s : d.sources) {
        const data::Manifest m = load_manifest(s, c);
        const std::string where = m.dir + "/manifest.json";
        if (d.manifest.empty()) {
            d.manifest = where;
            d.tokenizer_hash = m.tokenizer_hash;
            d.vocab_size = int64_t(m.vocab_size);
        } else if (m.tokenizer_hash != d.tokenizer_hash) {
            throw DataError(
                fmt::format("data.sources: '{}' was tokenized with tokenizer {} but "
                            "'{}' with {}; mix only shards of one tokenizer",
                            where, m.tokenizer_hash, d.manifest, d.tokenizer_hash));
        }
        if (file_tok && data::hex64(file_tok->hash()) != m.tokenizer_hash) {
            throw DataError(fmt::format(
                "'{}' was tokenized with tokenizer {}, but data.tokenizer_file '{}' has hash {}; "
                "re-run `apiary data prepare` with it, or name the shards' own tokenizer",
                where, m.tokenizer_hash, tokenizer_file, data::hex64(file_tok->hash())));
        }
        for (const std::string split : {"train", "val"}) {
            if (windows(m, split, T) == 0) {
                throw DataError(
                    fmt::format("{}: '{}' has no {} sample of {} tokens (train.seq_len + 1); {}",
                                corpus_name.empty() ? "data.sources" : corpus_name, where, split,
                                T + 1, no_sample_hint(split, !corpus_name.empty())));
            }
        }
        for (const auto& src : m.sources) bytes += src.value("bytes", uint64_t(0));
        for (const auto& sh : m.shards) tokens += sh.tokens;
    }
    d.bytes_per_token = tokens > 0 ? double(bytes) / double(tokens) : 0.0;
    if (d.description.empty()) {
        std::string names;
        for (const auto& s : d.sources) {
            names += fmt::format("{}{}:{:g}", names.empty() ? "" : ",", s.path, s.weight);
        }
        d.description = fmt::format("data.sources {}, tokenizer {}{}", names, d.tokenizer_hash,
                                    tokenizer_file.empty() ? "" : " (" + tokenizer_file + ")");
    }
    return d;
}

}  // namespace apiary::train
