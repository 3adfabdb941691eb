#pragma once
// A plain BPE encoder written from the definition, for tests: per pre-token,
// find the lowest-ranked adjacent pair (leftmost on a tie), merge it, repeat.
// Slow (a map lookup per pair per step) and obviously right, so the fast
// encoder (data/bpe_encode.cc) can be compared with it on any text. The
// deliberately wrong orders show that a text is able to catch an encoder
// that merges in the wrong order.

#include <cstdint>
#include <map>
#include <string_view>
#include <utility>
#include <vector>

#include "data/tokenizer.h"

namespace apiary::data::testing {

enum class MergeOrder {
    lowest_rank_leftmost,   // the definition (tiktoken, Hugging Face)
    lowest_rank_rightmost,  // wrong: ties go to the rightmost pair
    leftmost_mergeable,     // wrong: the leftmost pair that has any merge
};

class ReferenceEncoder {
  public:
    explicit ReferenceEncoder(const Tokenizer& tok);
    std::vector<uint32_t> encode(std::string_view text,
                                 MergeOrder order = MergeOrder::lowest_rank_leftmost) const;

  private:
    const Tokenizer* tok_;
    std::map<std::pair<uint32_t, uint32_t>, uint32_t> rank_;
    uint32_t byte_id_[256] = {};
};

// One-off: builds the encoder's tables for a single text.
std::vector<uint32_t> reference_encode(const Tokenizer& tok, std::string_view text,
                                       MergeOrder order = MergeOrder::lowest_rank_leftmost);

}  // namespace apiary::data::testing
