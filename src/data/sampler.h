#pragma once
// The pure functions behind the loader's order: a shuffle that needs no
// memory, and a mixture schedule with exact proportions. Both are functions of
// (seed, position) only, so any rank can compute any part of the stream and a
// resumed run continues exactly where the interrupted one stopped.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/rng.h"

namespace apiary::data {

// A pseudo-random permutation of [0, n): a 6-round Feistel network over the
// smallest even-bit power of two >= n, keyed by Philox(seed, stream), with
// cycle walking back into [0, n). O(1) memory, so a global shuffle over
// billions of samples across all shards costs nothing to set up.
class Permutation {
  public:
    Permutation(uint64_t n, uint64_t seed, uint64_t stream);
    uint64_t operator()(uint64_t i) const;
    uint64_t size() const { return n_; }

  private:
    uint64_t round(uint64_t r, uint64_t x) const;
    uint64_t n_;
    int half_bits_;
    uint64_t half_mask_;
    uint32_t key_[2];
};

// Chooses the source of each global sample position so that after any n
// positions source s has been chosen within one of w_s * n times: position g
// goes to the source with the largest deficit w_s * (g + 1) - drawn_s
// (ties: lowest index). Weights are normalized to sum 1.
class Mixer {
  public:
    explicit Mixer(std::vector<double> weights);
    // The source of the next position; advances the per-source counts.
    size_t next();
    const std::vector<uint64_t>& drawn() const { return drawn_; }
    uint64_t position() const { return position_; }
    void restore(uint64_t position, std::vector<uint64_t> drawn);

  private:
    std::vector<double> weights_;
    std::vector<uint64_t> drawn_;
    uint64_t position_ = 0;
};

}  // namespace apiary::data
