#include "core/rng.h"

#include <cmath>

namespace apiary::core {

std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
    constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
    constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
    for (int round = 0; round < 10; ++round) {
        const uint64_t p0 = uint64_t(kM0) * c[0];
        const uint64_t p1 = uint64_t(kM1) * c[2];
        c = {uint32_t(p1 >> 32) ^ c[1] ^ k[0], uint32_t(p1), uint32_t(p0 >> 32) ^ c[3] ^ k[1],
             uint32_t(p0)};
        k[0] += kW0;
        k[1] += kW1;
    }
    return c;
}

std::array<uint32_t, 4> Philox::block(uint64_t i) const {
    return philox4x32({uint32_t(i), uint32_t(i >> 32), uint32_t(stream_), uint32_t(stream_ >> 32)},
                      {uint32_t(seed_), uint32_t(seed_ >> 32)});
}

uint32_t Philox::u32(uint64_t index) const { return block(index / 4)[index % 4]; }

uint64_t Philox::u64(uint64_t index) const {
    const auto b = block(index / 2);
    const int o = int(index % 2) * 2;
    return (uint64_t(b[o]) << 32) | b[o + 1];
}

float Philox::uniform(uint64_t index) const {
    return float(u32(index) >> 8) * (1.0f / 16777216.0f);
}

double Philox::uniform_f64(uint64_t index) const {
    return double(u64(index) >> 11) * (1.0 / 9007199254740992.0);
}

float Philox::normal(uint64_t index) const {
    const auto b = block(index);
    // u1 in (0, 1] so the log is finite.
    const double u1 = (double(b[0] >> 8) + 1.0) * (1.0 / 16777216.0);
    const double u2 = double(b[1] >> 8) * (1.0 / 16777216.0);
    return float(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
}

uint64_t Philox::below(uint64_t index, uint64_t n) const {
    if (n <= 1) return 0;
    // Lemire: multiply a 64-bit word by n and keep the high half; reject the
    // few low values that would bias the result, retrying on words far from
    // the ones any other index uses.
    for (uint64_t attempt = 0;; ++attempt) {
        const uint64_t x = u64(index + attempt * 0x9E3779B97F4A7C15ull);
        const __uint128_t m = __uint128_t(x) * n;
        const uint64_t low = uint64_t(m);
        if (low >= n || low >= (-n) % n) return uint64_t(m >> 64);
    }
}

}  // namespace apiary::core
