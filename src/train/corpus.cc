#include "train/corpus.h"

#include <fmt/format.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/rng.h"

namespace apiary::train {

namespace {
constexpr int64_t kBlock = 64 * 1024;
}

std::string ByteCorpus::read_kjv() {
    // `bible` prints the requested verses; Genesis 1:1 to Revelation 22:21 is all of it.
    FILE* p = ::popen("bible gen1:1-rev22:21 2>/dev/null", "r");
    std::string text;
    if (p) {
        std::array<char, 1 << 16> buf;
        size_t n;
        while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) text.append(buf.data(), n);
        const int rc = ::pclose(p);
        if (rc != 0) text.clear();
    }
    if (text.size() < 1000000) {
        throw DataError(
            "data.corpus = 'kjv': the `bible` command (Debian packages bible-kjv and "
            "bible-kjv-text) is missing or printed nothing; run scripts/install-deps.sh, or set "
            "data.corpus to a text file");
    }
    return text;
}

ByteCorpus::ByteCorpus(const std::string& spec, double val_fraction, int64_t window_len) {
    std::string text;
    if (spec == "kjv") {
        text = read_kjv();
        source_ = "kjv (bible gen1:1-rev22:21)";
    } else {
        if (std::filesystem::is_directory(spec)) {
            throw DataError(fmt::format("data.corpus: '{}' is a directory; give a text file (or "
                                        "'kjv')",
                                        spec));
        }
        std::ifstream in(spec, std::ios::binary);
        if (!in) {
            throw DataError(fmt::format("data.corpus: cannot open '{}' (no such file, or not "
                                        "readable)",
                                        spec));
        }
        std::stringstream ss;
        ss << in.rdbuf();
        text = ss.str();
        source_ = spec;
    }
    // Every k-th block goes to validation: both splits sample the whole text.
    const int64_t k = std::max<int64_t>(2, int64_t(std::llround(1.0 / val_fraction)));
    const int64_t nblocks = (int64_t(text.size()) + kBlock - 1) / kBlock;
    for (int64_t b = 0; b < nblocks; ++b) {
        const int64_t lo = b * kBlock, hi = std::min<int64_t>(int64_t(text.size()), lo + kBlock);
        auto& dst = (b % k == k - 1) ? val_ : train_;
        dst.insert(dst.end(), text.begin() + lo, text.begin() + hi);
    }
    if (val_.empty() && !train_.empty()) {
        // A corpus of one block: hold out its tail instead.
        const size_t cut = train_.size() - size_t(double(train_.size()) * val_fraction);
        val_.assign(train_.begin() + long(cut), train_.end());
        train_.resize(cut);
    }
    if (int64_t(train_.size()) <= window_len || int64_t(val_.size()) <= window_len) {
        throw DataError(fmt::format(
            "data.corpus '{}': {} bytes split into {} train and {} held-out bytes, too small for "
            "windows of {} tokens (train.seq_len + 1); use a larger corpus or a shorter "
            "train.seq_len",
            spec, text.size(), train_.size(), val_.size(), window_len));
    }
}

void ByteCorpus::batch(bool val, uint64_t seed, int64_t step, int64_t micro, int64_t global_B,
                       int64_t first, int64_t B, int64_t T, int32_t* tokens,
                       int32_t* targets) const {
    const auto& src = val ? val_ : train_;
    const uint64_t span = src.size() - uint64_t(T);  // last valid start + 1
    // One Philox stream per (split, step): index = micro * global_B + sample.
    const core::Philox rng(seed, (uint64_t(val) << 63) | uint64_t(step));
    for (int64_t b = 0; b < B; ++b) {
        const uint64_t start = rng.below(uint64_t(micro * global_B + first + b), span);
        const uint8_t* w = src.data() + start;
        for (int64_t t = 0; t < T; ++t) {
            tokens[b * T + t] = w[t];
            targets[b * T + t] = w[t + 1];
        }
    }
}

double ByteCorpus::unigram_entropy() const {
    std::array<double, 256> count{};
    for (uint8_t c : train_) count[c] += 1;
    double h = 0;
    for (double c : count) {
        if (c > 0) {
            const double p = c / double(train_.size());
            h -= p * std::log(p);
        }
    }
    return h;
}

}  // namespace apiary::train
