#pragma once
// The byte-level corpus of the default main job: a text file (or the King
// James Bible dumped by Debian's `bible`) read whole, its bytes used as token
// ids 0-255, split into train and held-out blocks. The BPE tokenizer and
// sharded loader of data/ supersede this for large corpora.

#include <cstdint>
#include <string>
#include <vector>

namespace apiary::train {

class ByteCorpus {
public:
    // spec: "kjv" or a file path. Throws DataError if missing or too small
    // for windows of window_len tokens in both splits.
    ByteCorpus(const std::string& spec, double val_fraction, int64_t window_len);

    // Fills tokens/targets (B, T) with B windows from the split: targets are
    // tokens shifted by one. A micro-step draws global_B windows in all, of
    // which this call fills [first, first + B) (a data-parallel rank's
    // slice). Window starts are a pure function of (seed, step, micro, global
    // index), so a run is reproducible, resumable at any step, and the same
    // global batch whatever the number of ranks.
    void batch(bool val, uint64_t seed, int64_t step, int64_t micro, int64_t global_B,
               int64_t first, int64_t B, int64_t T, int32_t* tokens, int32_t* targets) const;

    int64_t train_size() const { return int64_t(train_.size()); }
    int64_t val_size() const { return int64_t(val_.size()); }
    const std::string& source() const { return source_; }
    // Unigram entropy of the training bytes in nats: the loss of the best
    // model that ignores context.
    double unigram_entropy() const;

    static std::string read_kjv();  // runs `bible`, throws DataError if absent

private:
    std::string source_;
    std::vector<uint8_t> train_, val_;
};

}  // namespace apiary::train
