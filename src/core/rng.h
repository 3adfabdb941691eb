#pragma once
// Philox4x32-10 (Salmon et al., "Parallel Random Numbers: As Easy as 1, 2, 3",
// SC'11): a counter-based generator. Any element of any stream is a pure
// function of (seed, stream, index), so every rank can reproduce any slice of
// an initialisation or a shuffle without generating what precedes it.

#include <array>
#include <cstdint>

namespace apiary::core {

std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key);

class Philox {
public:
    Philox(uint64_t seed, uint64_t stream) : seed_(seed), stream_(stream) {}

    // Four 32-bit words for block `i` of this stream.
    std::array<uint32_t, 4> block(uint64_t i) const;
    uint32_t u32(uint64_t index) const;        // the index-th 32-bit word
    uint64_t u64(uint64_t index) const;        // words 2*index, 2*index+1
    float uniform(uint64_t index) const;       // [0, 1) with 24 random bits
    double uniform_f64(uint64_t index) const;  // [0, 1) with 53 random bits
    float normal(uint64_t index) const;        // N(0, 1) by Box-Muller on two words
    // Uniform integer in [0, n) without modulo bias (Lemire's method, with
    // a deterministic retry on later indices).
    uint64_t below(uint64_t index, uint64_t n) const;

private:
    uint64_t seed_;
    uint64_t stream_;
};

// A sequential wrapper for code that just wants the next number.
class RngStream {
public:
    RngStream(uint64_t seed, uint64_t stream) : rng_(seed, stream) {}
    float uniform() { return rng_.uniform(next_++); }
    float normal() { return rng_.normal(next_++); }
    uint64_t below(uint64_t n) { return rng_.below(next_++, n); }
    uint64_t position() const { return next_; }
    void seek(uint64_t position) { next_ = position; }

private:
    Philox rng_;
    uint64_t next_ = 0;
};

}  // namespace apiary::core
