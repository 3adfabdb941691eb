// `apiary data prepare|verify|info`: token shards and their manifest
// (data/prepare.h, data/shard.h; format in docs/formats.md).

#include <fmt/format.h>

#include "cli/command.h"
#include "core/error.h"
#include "data/file_io.h"
#include "data/prepare.h"
#include "data/shard.h"
#include "data/tokenizer.h"

namespace apiary::cli {

namespace {

data::PrepareOptions popt;
size_t unit_kb = 256, shard_mb = 64;
std::string dir, tokenizer;

void verify() {
    const auto m = data::Manifest::load(dir);
    if (!tokenizer.empty()) {
        const auto h = data::hex64(data::Tokenizer::load(tokenizer).hash());
        if (h != m.tokenizer_hash) {
            throw DataError(
                fmt::format("manifest '{}/manifest.json' was made with tokenizer {} "
                            "but '{}' has hash {}",
                            m.dir, m.tokenizer_hash, tokenizer, h));
        }
    }
    uint64_t tokens = 0;
    for (const auto& s : m.shards) {
        data::ShardReader r(m.shard_path(s));
        data::check_against_manifest(r, m, s);  // size, counts, dtype, tokenizer, vocabulary
        r.verify(s.xxh64);                      // checksum, every token in the vocabulary
        tokens += r.num_tokens();
    }
    fmt::print(
        "ok: {} shards, {} tokens; sizes, counts, tokenizer, vocabulary size {} and checksums "
        "match the manifest\n",
        m.shards.size(), tokens, m.vocab_size);
}

void setup(CLI::App& app) {
    auto* cmd = app.add_subcommand("data", "prepare and check token shards");
    cmd->require_subcommand(1);

    auto* prep = cmd->add_subcommand("prepare", "tokenize text/JSONL/zstd files into shards");
    prep->add_option("--input", popt.inputs, "input files (.txt, .jsonl, optionally .zst)")
        ->required();
    prep->add_option("--tokenizer", popt.tokenizer, "tokenizer.json")->required();
    prep->add_option("--out", popt.out, "output directory")->required();
    prep->add_option("--jsonl-field", popt.jsonl_field, "field of each JSONL line to use");
    prep->add_option("--val-fraction", popt.val_fraction, "fraction of units held out as val");
    prep->add_option("--unit-kb", unit_kb, "text per work unit (KiB); the split/parallel grain");
    prep->add_option("--shard-mb", shard_mb, "text per shard (MiB, rounded to units)");
    prep->add_option("--threads", popt.num_threads, "threads (0: all cores)");
    prep->callback([] {
        popt.unit_bytes = unit_kb << 10;
        popt.shard_units = std::max<size_t>(1, (shard_mb << 20) / popt.unit_bytes);
        const auto st = data::prepare(popt);
        for (const auto& w : st.warnings) fmt::print(stderr, "apiary: warning: {}\n", w);
        if (st.already_complete) {
            fmt::print("{} is already complete (manifest.json present, same settings)\n", popt.out);
            return;
        }
        fmt::print(
            "prepared {:.1f} MB, {} documents -> {} train + {} val tokens; {} shards "
            "written, {} already done; {:.2f}s ({:.1f} MB/s)\n",
            st.bytes / 1e6, st.documents, st.train_tokens, st.val_tokens, st.shards_written,
            st.shards_skipped, st.seconds, st.bytes / 1e6 / std::max(st.seconds, 1e-9));
    });

    auto* ver = cmd->add_subcommand("verify", "check every shard against the manifest");
    ver->add_option("dir", dir, "directory with manifest.json")->required();
    ver->add_option("--tokenizer", tokenizer, "also check the manifest's tokenizer hash");
    ver->callback(verify);

    auto* info = cmd->add_subcommand("info", "the manifest in brief");
    info->add_option("dir", dir, "directory with manifest.json")->required();
    info->callback([] {
        const auto m = data::Manifest::load(dir);
        uint64_t train = 0, val = 0;
        for (const auto& s : m.shards) (s.split == "val" ? val : train) += s.tokens;
        fmt::print(
            "tokenizer {} (vocab {}), {} tokens\nshards {}\ntrain tokens {}\nval tokens "
            "{}\n",
            m.tokenizer_hash, m.vocab_size, m.token_bytes == 2 ? "uint16" : "uint32",
            m.shards.size(), train, val);
    });
}

CommandRegistrar reg("data", setup);

}  // namespace

}  // namespace apiary::cli
