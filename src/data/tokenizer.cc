#include "data/tokenizer.h"

#include <omp.h>

#include <algorithm>

#include "core/error.h"
#include "data/pretokenize.h"

namespace apiary::data {

namespace {

// Inputs below this size are encoded on the calling thread.
constexpr size_t kParallelMinBytes = 1 << 20;

}  // namespace

Tokenizer::Tokenizer(std::vector<std::string> vocab, std::vector<Merge> merges,
                     std::vector<std::pair<std::string, uint32_t>> specials)
    : vocab_(std::move(vocab)), merges_(std::move(merges)), specials_(std::move(specials)) {
    build_index();
}

void Tokenizer::build_index() {
    bool have[256] = {};
    for (uint32_t id = 0; id < vocab_.size(); ++id) {
        const auto& t = vocab_[id];
        if (t.size() == 1) {
            const auto b = static_cast<unsigned char>(t[0]);
            // A special token may be one byte long too; the first id wins.
            bool is_special = false;
            for (const auto& s : specials_) is_special |= s.second == id;
            if (!have[b] && !is_special) {
                byte_id_[b] = id;
                have[b] = true;
            }
        }
    }
    for (int b = 0; b < 256; ++b) {
        if (!have[b]) {
            throw DataError(
                fmt::format("tokenizer: byte 0x{:02x} has no token; a byte-level BPE "
                            "vocabulary needs all 256 single bytes",
                            b));
        }
    }
    if (vocab_.size() > PairTable::kMaxVocab) {
        throw DataError(fmt::format(
            "tokenizer: {} ids; apiary's BPE encoder supports vocabularies of up to {} ids",
            vocab_.size(), PairTable::kMaxVocab));
    }
    for (uint32_t r = 0; r < merges_.size(); ++r) {
        const auto& m = merges_[r];
        if (m.left >= vocab_.size() || m.right >= vocab_.size() || m.result >= vocab_.size()) {
            throw DataError(
                fmt::format("tokenizer: merge {} refers to an id past the vocabulary "
                            "size {}",
                            r, vocab_.size()));
        }
        if (vocab_[m.left] + vocab_[m.right] != vocab_[m.result]) {
            throw DataError(
                fmt::format("tokenizer: merge {} ({} + {} -> {}) does not concatenate "
                            "its parts",
                            r, m.left, m.right, m.result));
        }
    }
    pairs_.build(merges_);
    pairs_.build_bytes(byte_id_);
    for (const auto& s : specials_) {
        if (s.first.empty() || s.second >= vocab_.size()) {
            throw DataError(
                fmt::format("tokenizer: special token '{}' has id {} past the "
                            "vocabulary size {} or is empty",
                            s.first, s.second, vocab_.size()));
        }
    }
}

uint32_t Tokenizer::special_id(const std::string& text) const {
    for (const auto& s : specials_) {
        if (s.first == text) return s.second;
    }
    throw DataError(
        fmt::format("tokenizer: no special token '{}'; train or load a tokenizer "
                    "that has it",
                    text));
}

bool Tokenizer::has_special(const std::string& text) const {
    for (const auto& s : specials_) {
        if (s.first == text) return true;
    }
    return false;
}

// ---- encoding (the Encoder is in bpe_encode.cc) ------------------------------

void Tokenizer::encode_append(std::string_view text, std::vector<uint32_t>& out,
                              bool allow_special) const {
    Encoder enc(*this);
    enc.encode(text, out, allow_special);
}

std::vector<uint32_t> Tokenizer::encode(std::string_view text, bool allow_special,
                                        int num_threads) const {
    std::vector<uint32_t> out;
    if (num_threads <= 0) num_threads = omp_get_max_threads();
    if (text.size() < kParallelMinBytes || num_threads == 1) {
        out.reserve(text.size() / 3);
        encode_append(text, out, allow_special);
        return out;
    }
    // Chunks start at safe split points (see pretokenize.h) that are not
    // inside a special token, so the result equals one sequential pass.
    const size_t target = std::max<size_t>(text.size() / (size_t(num_threads) * 8), 1 << 16);
    std::vector<size_t> cuts{0};
    while (cuts.back() < text.size()) {
        size_t p = safe_split_point(text, std::min(text.size(), cuts.back() + target));
        for (bool inside = true; inside && p < text.size();) {
            inside = false;
            for (const auto& sp : specials_) {
                const size_t len = sp.first.size();
                const size_t from = p >= len ? p - len + 1 : 0;
                const size_t hit = text.substr(from, 2 * len).find(sp.first);
                if (allow_special && hit != std::string_view::npos && from + hit < p &&
                    from + hit + len > p) {
                    inside = true;
                }
            }
            if (inside) p = safe_split_point(text, p + 1);
        }
        cuts.push_back(p);
    }
    const size_t chunks = cuts.size() - 1;
    std::vector<std::vector<uint32_t>> parts(chunks);
#pragma omp parallel num_threads(num_threads)
    {
        Encoder enc(*this);
#pragma omp for schedule(dynamic, 1)
        for (size_t c = 0; c < chunks; ++c) {
            parts[c].reserve((cuts[c + 1] - cuts[c]) / 3);
            enc.encode(text.substr(cuts[c], cuts[c + 1] - cuts[c]), parts[c], allow_special);
        }
    }
    size_t total = 0;
    for (const auto& p : parts) total += p.size();
    out.reserve(total);
    for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
    return out;
}

void Tokenizer::decode_append(const uint32_t* ids, size_t n, std::string& out) const {
    for (size_t k = 0; k < n; ++k) {
        if (ids[k] >= vocab_.size()) {
            throw DataError(
                fmt::format("decode: token id {} at position {} is past the "
                            "vocabulary size {}",
                            ids[k], k, vocab_.size()));
        }
        out += vocab_[ids[k]];
    }
}

std::string Tokenizer::decode(const std::vector<uint32_t>& ids) const {
    std::string out;
    decode_append(ids.data(), ids.size(), out);
    return out;
}

}  // namespace apiary::data
