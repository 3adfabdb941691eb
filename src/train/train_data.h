#pragma once
// What `apiary train` reads, resolved from the data.* keys before anything
// is written to the run directory:
//
//   data.sources set   prepared token shards (`apiary data prepare`), as they
//                      are; their tokenizer is data.tokenizer_file (optional).
//   otherwise          data.corpus ('kjv' or a text file) tokenized by
//                      data.tokenizer -- 'bpe': data.tokenizer_file if set,
//                      else a byte-level BPE of data.bpe_vocab_size tokens
//                      trained on the corpus; 'byte': the 256 bytes and
//                      <|endoftext|> -- and prepared into token shards.
//
// Either way training reads shards through data::Loader: there is one data
// path. Corpora are prepared into data.cache_dir, keyed by content:
//   kjv-<xxh64>.txt              the text `bible` printed
//   bpe-<corpus xxh64>-<V>.json  a tokenizer of V tokens trained on that corpus
//   shards-<key>/                manifest.json and shards; key = xxh64 of the
//                                corpus hash, tokenizer hash and prepare settings
// An entry is written under a temporary name and renamed, so it exists whole
// or not at all: concurrent runs and a crash mid-way leave no half entry,
// and a re-run with the same corpus and settings only finds the entries.

#include <cstdint>
#include <string>
#include <vector>

#include "core/config.h"
#include "data/loader.h"

namespace apiary::train {

// The run's tokenizer, in the run directory, for `apiary generate`.
inline constexpr const char* kTokenizerFile = "tokenizer.json";

struct TrainData {
    std::vector<data::SourceSpec> sources;  // for LoaderOptions::sources
    std::string tokenizer_hash;             // hex, the same in every source's manifest
    // tokenizer.json text saved with the run for `apiary generate`; empty for
    // data.sources without data.tokenizer_file.
    std::string tokenizer_json;
    int64_t vocab_size = 0;      // the tokenizer's (from the manifests)
    std::string manifest;        // first source's manifest.json, for messages
    double bytes_per_token = 0;  // text bytes per token over every source (0: unknown)
    std::string description;     // one line for the banner
};

// Checks the data.* keys, the manifests and the tokenizer, and for
// data.corpus builds whatever the cache lacks (printing what it does when
// verbose). Throws ConfigError / DataError / IoError naming the key or file.
TrainData resolve_train_data(const core::Config& config, bool verbose);

// The King James Bible as Debian's `bible` prints it (genesis to revelation);
// DataError if the command is missing.
std::string read_kjv();

}  // namespace apiary::train
