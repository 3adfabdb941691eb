#pragma once
// Byte-level BPE training.
//
//   BpeTrainer trainer({.vocab_size = 8192});
//   trainer.add_text(chunk);           // any number of times, any chunk size
//   Tokenizer tok = trainer.train();
//
// add_text() pre-tokenizes in parallel and keeps only a count per distinct
// pre-token, so memory is bounded by the number of distinct words, not by the
// corpus. train() then merges with incremental pair counts: each merge
// touches only the words that contain the merged pair (found through a
// pair -> words index), and a lazy max-heap yields the next pair, so the
// corpus is never rescanned. Words touched by one merge are rewritten in
// parallel when there are many.
//
// Ties (equal counts) go to the pair with the smaller (left id, right id);
// ids 0..255 are the bytes themselves and later ids are in merge order, so
// the result is deterministic and independent of the thread count.

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "data/documents.h"
#include "data/tokenizer.h"

namespace apiary::data {

struct BpeTrainOptions {
    size_t vocab_size = 50257;  // bytes + merges + special tokens
    std::vector<std::string> specials = {"<|endoftext|>"};
    int num_threads = 0;  // 0: all cores
};

class BpeTrainer {
  public:
    explicit BpeTrainer(BpeTrainOptions options);
    // Special-token text in `text` is skipped, never learned from.
    void add_text(std::string_view text);
    // Merges until the vocabulary (with the special tokens, given the last
    // ids) reaches vocab_size, or no pair is left. Feed files through
    // data/documents.h (text, JSONL, zstd), as `apiary tokenizer train` does.
    Tokenizer train() const;
    size_t distinct_words() const { return words_.size(); }

  private:
    void count_chunk(std::string_view text, std::unordered_map<std::string, uint64_t>& out) const;
    BpeTrainOptions options_;
    std::unordered_map<std::string, uint64_t> words_;
};

// Trains on whole files (text, JSONL, zstd: data/documents.h), as `apiary
// tokenizer train` and the trainer's built-in corpus preparation do. Blocks
// are batched into ~8 MB calls joined by <|endoftext|>, which add_text cuts
// out, so words never run across documents and each call has enough text to
// use every core. bytes_read (optional) receives the input size.
Tokenizer train_bpe_on_files(const std::vector<std::string>& inputs,
                             const BpeTrainOptions& options,
                             const DocumentOptions& documents = {},
                             size_t* bytes_read = nullptr, size_t* distinct_words = nullptr);

}  // namespace apiary::data
