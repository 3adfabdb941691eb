#include "data/sampler.h"

#include <numeric>

#include "core/error.h"

namespace apiary::data {

Permutation::Permutation(uint64_t n, uint64_t seed, uint64_t stream) : n_(n) {
    const uint64_t k = core::Philox(seed, stream).u64(0);
    key_[0] = uint32_t(k);
    key_[1] = uint32_t(k >> 32);
    int bits = 2;
    while (bits < 64 && (uint64_t(1) << bits) < n) ++bits;
    if (bits % 2) ++bits;
    half_bits_ = bits / 2;
    half_mask_ = (uint64_t(1) << half_bits_) - 1;
}

uint64_t Permutation::round(uint64_t r, uint64_t x) const {
    const auto b = core::philox4x32({uint32_t(x), uint32_t(x >> 32), uint32_t(r), 0x5eedu},
                                    {key_[0], key_[1]});
    return ((uint64_t(b[0]) << 32) | b[1]) & half_mask_;
}

uint64_t Permutation::operator()(uint64_t i) const {
    APIARY_CHECK(i < n_, "permutation index {} out of [0, {})", i, n_);
    uint64_t x = i;
    // Cycle walking: the Feistel network permutes [0, 4^half); repeating it
    // from a value outside [0, n) lands inside after a few steps (the domain
    // is < 4n) and keeps the map a bijection on [0, n).
    do {
        uint64_t left = x >> half_bits_, right = x & half_mask_;
        for (uint64_t r = 0; r < 6; ++r) {
            const uint64_t next = left ^ round(r, right);
            left = right;
            right = next;
        }
        x = (left << half_bits_) | right;
    } while (x >= n_);
    return x;
}

Mixer::Mixer(std::vector<double> weights) : weights_(std::move(weights)) {
    APIARY_CHECK(!weights_.empty(), "mixer needs at least one source");
    double sum = 0;
    for (double w : weights_) {
        APIARY_CHECK(w > 0, "source weight {} must be positive", w);
        sum += w;
    }
    for (double& w : weights_) w /= sum;
    drawn_.assign(weights_.size(), 0);
}

size_t Mixer::next() {
    size_t best = 0;
    double best_deficit = -1e300;
    const double n = double(position_ + 1);
    for (size_t s = 0; s < weights_.size(); ++s) {
        const double deficit = weights_[s] * n - double(drawn_[s]);
        if (deficit > best_deficit) {
            best_deficit = deficit;
            best = s;
        }
    }
    ++drawn_[best];
    ++position_;
    return best;
}

void Mixer::restore(uint64_t position, std::vector<uint64_t> drawn) {
    APIARY_CHECK(drawn.size() == weights_.size(), "state has {} sources, the loader {}",
                 drawn.size(), weights_.size());
    APIARY_CHECK(std::accumulate(drawn.begin(), drawn.end(), uint64_t(0)) == position,
                 "state counts do not sum to its position {}", position);
    position_ = position;
    drawn_ = std::move(drawn);
}

}  // namespace apiary::data
