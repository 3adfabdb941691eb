#include "data/prepare.h"

#include <omp.h>

#include <cmath>
#include <filesystem>
#include <map>

#include "core/error.h"
#include "core/timing.h"
#include "data/documents.h"
#include "data/file_io.h"
#include "data/shard.h"
#include "data/tokenizer.h"

namespace apiary::data {

namespace fs = std::filesystem;

namespace {

struct Segment {
    std::string text;
    bool starts_document;
};

struct Unit {
    uint64_t index = 0;
    std::string split;
    size_t shard = 0;  // shard index within the split
    std::vector<Segment> segments;
    size_t bytes = 0;
    bool skip = false;  // its shard is already on disk
    std::vector<uint32_t> tokens;
    std::vector<uint64_t> doc_starts;  // relative to this unit's first token
};

std::string shard_name(const std::string& split, size_t index) {
    return fmt::format("{}_{:06d}.bin", split, index);
}

// Accumulates one split's units into shards and writes each when full.
class SplitWriter {
  public:
    SplitWriter(std::string split, const PrepareOptions& opt, const Tokenizer& tok,
                uint32_t token_bytes, PrepareStats& stats)
        : split_(std::move(split)),
          opt_(opt),
          tok_(tok),
          token_bytes_(token_bytes),
          stats_(stats) {}

    void add(Unit& u) {
        if (u.shard != current_) flush();
        current_ = u.shard;
        if (u.skip) return;
        for (uint64_t d : u.doc_starts) docs_.push_back(tokens_.size() + d);
        tokens_.insert(tokens_.end(), u.tokens.begin(), u.tokens.end());
        dirty_ = true;
    }

    void flush() {
        if (!dirty_) return;
        write_shard((fs::path(opt_.out) / shard_name(split_, current_)).string(), tokens_, docs_,
                    token_bytes_, tok_.hash(), tok_.vocab_size());
        ++stats_.shards_written;
        tokens_.clear();
        docs_.clear();
        dirty_ = false;
        if (opt_.fail_after_shards >= 0 &&
            static_cast<int64_t>(stats_.shards_written) >= opt_.fail_after_shards) {
            throw IoError("prepare: stopped after the requested number of shards (test hook)");
        }
    }

  private:
    std::string split_;
    const PrepareOptions& opt_;
    const Tokenizer& tok_;
    uint32_t token_bytes_;
    PrepareStats& stats_;
    size_t current_ = 0;
    bool dirty_ = false;
    std::vector<uint32_t> tokens_;
    std::vector<uint64_t> docs_;
};

nlohmann::json settings_of(const PrepareOptions& o, const Tokenizer& tok) {
    nlohmann::json inputs = nlohmann::json::array();
    for (const auto& p : o.inputs) {
        if (const std::string why = unusable_input(p); !why.empty()) {
            throw DataError(fmt::format("prepare: input '{}' {}", p, why));
        }
        inputs.push_back({{"path", p}, {"bytes", fs::file_size(p)}});
    }
    return {{"inputs", inputs},
            {"tokenizer_hash", hex64(tok.hash())},
            {"jsonl_field", o.jsonl_field},
            {"val_fraction", o.val_fraction},
            {"unit_bytes", o.unit_bytes},
            {"shard_units", o.shard_units}};
}

// Unit 0 goes to the validation split, so an input of one unit has no train
// tokens at all: that is an error (a dataset nothing can train on), and a
// train split smaller than the validation split is worth a warning.
void check_split(const PrepareOptions& opt, PrepareStats& stats, uint64_t units,
                 uint64_t val_units) {
    const std::string how = fmt::format(
        "the input ({} bytes) made {} unit{} of up to {} bytes and the validation split took {} "
        "(unit 0 always goes there, then a fraction {} of them)",
        stats.bytes, units, units == 1 ? "" : "s", opt.unit_bytes, val_units, opt.val_fraction);
    const std::string fix =
        "give more text, smaller units or a validation fraction of 0 (apiary data prepare "
        "--unit-kb / --val-fraction; apiary train: data.val_fraction)";
    if (stats.train_tokens == 0) {
        // No manifest: the output must not pass for a complete dataset.
        throw DataError(fmt::format("prepare: no train tokens: {}; {}", how, fix));
    }
    if (stats.train_tokens < stats.val_tokens) {
        stats.warnings.push_back(
            fmt::format("only {} train tokens against {} validation tokens: {}; {}",
                        stats.train_tokens, stats.val_tokens, how, fix));
    }
}

}  // namespace

PrepareStats prepare(const PrepareOptions& opt) {
    const auto t0 = core::Clock::now();
    if (opt.inputs.empty()) throw ConfigError("prepare: no --input files");
    if (opt.val_fraction < 0 || opt.val_fraction >= 1) {
        throw ConfigError(
            fmt::format("prepare: --val-fraction {} must be in [0, 1)", opt.val_fraction));
    }
    const Tokenizer tok = Tokenizer::load(opt.tokenizer);
    const uint32_t eot = tok.special_id("<|endoftext|>");
    const uint32_t token_bytes = tok.vocab_size() <= 65536 ? 2 : 4;
    const nlohmann::json settings = settings_of(opt, tok);
    fs::create_directories(opt.out);
    PrepareStats stats;

    const std::string plan_path = (fs::path(opt.out) / "prepare.json").string();
    if (fs::exists(plan_path)) {
        nlohmann::json old;
        try {
            old = nlohmann::json::parse(read_file(plan_path));
        } catch (const nlohmann::json::parse_error&) {
            old = nullptr;
        }
        if (old != settings) {
            throw ConfigError(
                fmt::format("prepare: '{}' was prepared with other inputs or "
                            "settings ({}); use another --out or delete it",
                            opt.out, plan_path));
        }
        if (fs::exists(fs::path(opt.out) / "manifest.json")) {
            stats.already_complete = true;
            return stats;
        }
    } else {
        write_file_atomic(plan_path, settings.dump(1) + "\n");
    }

    std::map<std::string, bool> on_disk;
    for (const auto& e : fs::directory_iterator(opt.out)) {
        if (e.path().extension() == ".bin") on_disk[e.path().filename().string()] = true;
    }

    const int threads = opt.num_threads > 0 ? opt.num_threads : omp_get_max_threads();
    std::vector<Tokenizer::Encoder> encoders(static_cast<size_t>(threads), Tokenizer::Encoder(tok));
    SplitWriter train("train", opt, tok, token_bytes, stats),
        val("val", opt, tok, token_bytes, stats);
    std::map<std::string, uint64_t> split_units;
    std::vector<Unit> round;
    const size_t round_size = static_cast<size_t>(threads) * 4;
    uint64_t next_index = 0;
    nlohmann::json sources = nlohmann::json::array();

    auto run_round = [&] {
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
        for (size_t i = 0; i < round.size(); ++i) {
            Unit& u = round[i];
            if (u.skip) continue;
            auto& enc = encoders[static_cast<size_t>(omp_get_thread_num())];
            for (const auto& seg : u.segments) {
                if (seg.starts_document) {
                    u.doc_starts.push_back(u.tokens.size());
                    u.tokens.push_back(eot);
                }
                enc.encode_ordinary(seg.text, u.tokens);
            }
        }
        for (auto& u : round) {
            (u.split == "val" ? val : train).add(u);
            (u.split == "val" ? stats.val_tokens : stats.train_tokens) += u.tokens.size();
        }
        round.clear();
    };
    auto new_unit = [&] {
        Unit u;
        u.index = next_index++;
        const double f = opt.val_fraction;
        const bool is_val =
            f > 0 && std::floor(double(u.index) * f) > std::floor((double(u.index) - 1) * f);
        u.split = is_val ? "val" : "train";
        u.shard = split_units[u.split]++ / opt.shard_units;
        u.skip = on_disk.count(shard_name(u.split, u.shard)) > 0;
        round.push_back(std::move(u));
    };

    DocumentOptions dopt;
    dopt.jsonl_field = opt.jsonl_field;
    dopt.block_bytes = opt.unit_bytes;
    new_unit();
    for (const auto& path : opt.inputs) {
        uint64_t docs = 0, bytes = 0;
        for_each_piece(path, dopt, [&](std::string_view text, bool starts) {
            if (round.back().bytes >= opt.unit_bytes) {
                if (round.size() >= round_size) run_round();
                new_unit();
            }
            Unit& u = round.back();
            if (!u.skip) u.segments.push_back({std::string(text), starts});
            u.bytes += text.size();
            docs += starts;
            bytes += text.size();
        });
        sources.push_back({{"path", path}, {"bytes", bytes}, {"documents", docs}});
        stats.documents += docs;
        stats.bytes += bytes;
    }
    run_round();
    train.flush();
    val.flush();

    Manifest m;
    m.dir = opt.out;
    m.tokenizer_hash = hex64(tok.hash());
    m.vocab_size = tok.vocab_size();
    m.token_bytes = token_bytes;
    m.sources = sources;
    m.settings = settings;
    for (const std::string split : {"train", "val"}) {
        const uint64_t units = split_units[split];
        const size_t n_shards = (units + opt.shard_units - 1) / opt.shard_units;
        for (size_t k = 0; k < n_shards; ++k) {
            const std::string name = shard_name(split, k);
            if (on_disk.count(name)) ++stats.shards_skipped;
            ShardReader r((fs::path(opt.out) / name).string());
            m.shards.push_back({name, split, r.num_tokens(), r.num_docs(), fs::file_size(r.path()),
                                hex64(r.file_hash())});
        }
    }
    // Token counts of skipped shards come from the files themselves.
    stats.train_tokens = stats.val_tokens = 0;
    for (const auto& s : m.shards)
        (s.split == "val" ? stats.val_tokens : stats.train_tokens) += s.tokens;
    check_split(opt, stats, next_index, split_units["val"]);
    m.save();
    stats.seconds = core::seconds_since(t0);
    return stats;
}

}  // namespace apiary::data
