#pragma once
// `apiary data prepare`: corpus files -> token shards + manifest.json.
//
// The input is read as a stream of units of about `unit_bytes` of text
// (whole JSONL documents, or pre-token-aligned blocks of plain text). Units
// are tokenized in parallel rounds of a few per thread, so memory stays
// bounded whatever the corpus size. Unit u goes to the validation split when
// floor(u * f) > floor((u - 1) * f) for f = val_fraction (unit 0 first, then
// a fraction f of all units, spread evenly). Each split's units fill shards
// of `shard_units` units. Every document starts with <|endoftext|>.
//
// Resuming: the settings are written to DIR/prepare.json first; a later run
// with the same settings skips every shard already on disk (shards appear
// only complete, by rename) and does not even tokenize its units.

#include <cstdint>
#include <string>
#include <vector>

namespace apiary::data {

struct PrepareOptions {
    std::vector<std::string> inputs;
    std::string tokenizer;  // tokenizer.json
    std::string out;        // output directory
    std::string jsonl_field = "text";
    double val_fraction = 0.05;
    size_t unit_bytes = 256u << 10;
    size_t shard_units = 256;  // 64 MB of text per shard by default
    int num_threads = 0;
    // Tests: throw after writing this many shards in this run (simulates a crash).
    int64_t fail_after_shards = -1;
};

struct PrepareStats {
    uint64_t bytes = 0, documents = 0, train_tokens = 0, val_tokens = 0;
    size_t shards_written = 0, shards_skipped = 0;
    double seconds = 0;
    bool already_complete = false;
    // Things the caller should tell the user (e.g. a split much smaller than intended).
    std::vector<std::string> warnings;
};

// Throws DataError naming the input for an input that does not exist, is
// empty or is not a regular file, and when the result would hold no train
// tokens (then no manifest.json is written, so the directory is never taken
// for a complete dataset).
PrepareStats prepare(const PrepareOptions& options);

}  // namespace apiary::data
