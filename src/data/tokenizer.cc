#include "data/tokenizer.h"

#include <omp.h>

#include <algorithm>
#include <queue>

#include "core/error.h"
#include "data/pretokenize.h"

namespace apiary::data {

namespace {

// Pieces longer than this merge with a heap (O(n log n)); shorter ones with a
// linear scan per merge, which is faster for the short words of real text.
constexpr size_t kShortPiece = 48;
// An encoder's pre-token cache is dropped when it grows past this many entries.
constexpr size_t kMaxCacheEntries = 1 << 20;
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
    pair_rank_.clear();
    pair_rank_.reserve(merges_.size() * 2);
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
        // A pair listed twice keeps its first (lowest) rank, as in Hugging Face.
        pair_rank_.emplace((uint64_t(m.left) << 32) | m.right, r);
    }
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

// ---- encoding ---------------------------------------------------------------

void Tokenizer::Encoder::merge_short(std::string_view piece, std::vector<uint32_t>& out) {
    auto& ids = ids_;
    auto& ranks = ranks_;
    ids.clear();
    for (unsigned char b : piece) ids.push_back(tok_->byte_id_[b]);
    ranks.resize(ids.size());
    for (size_t k = 0; k + 1 < ids.size(); ++k) ranks[k] = tok_->merge_of(ids[k], ids[k + 1]).first;
    ranks.back() = UINT32_MAX;
    while (ids.size() > 1) {
        size_t best = 0;
        for (size_t k = 1; k + 1 < ids.size(); ++k) {
            if (ranks[k] < ranks[best]) best = k;
        }
        if (ranks[best] == UINT32_MAX) break;
        ids[best] = tok_->merges_[ranks[best]].result;
        ids.erase(ids.begin() + static_cast<ptrdiff_t>(best) + 1);
        ranks.erase(ranks.begin() + static_cast<ptrdiff_t>(best) + 1);
        ranks[best] =
            best + 1 < ids.size() ? tok_->merge_of(ids[best], ids[best + 1]).first : UINT32_MAX;
        if (best > 0) ranks[best - 1] = tok_->merge_of(ids[best - 1], ids[best]).first;
    }
    out.insert(out.end(), ids.begin(), ids.end());
}

void Tokenizer::Encoder::merge_long(std::string_view piece, std::vector<uint32_t>& out) {
    // Symbols in a doubly linked list over the original byte positions; heap
    // entries are (rank, left position, left id, right id) and are stale when
    // either symbol has since changed, so no decrease-key is needed.
    const size_t n = piece.size();
    std::vector<uint32_t> id(n);
    std::vector<int64_t> prev(n), next(n);
    std::vector<bool> alive(n, true);
    for (size_t k = 0; k < n; ++k) {
        id[k] = tok_->byte_id_[static_cast<unsigned char>(piece[k])];
        prev[k] = static_cast<int64_t>(k) - 1;
        next[k] = k + 1 < n ? static_cast<int64_t>(k + 1) : -1;
    }
    struct Entry {
        uint32_t rank;
        int64_t pos;
        uint32_t left, right;
        bool operator>(const Entry& o) const {
            return rank != o.rank ? rank > o.rank : pos > o.pos;
        }
    };
    std::priority_queue<Entry, std::vector<Entry>, std::greater<>> heap;
    auto push = [&](int64_t p) {
        if (p < 0 || next[p] < 0) return;
        const uint32_t r = tok_->merge_of(id[p], id[next[p]]).first;
        if (r != UINT32_MAX) heap.push({r, p, id[p], id[next[p]]});
    };
    for (size_t k = 0; k + 1 < n; ++k) push(static_cast<int64_t>(k));
    while (!heap.empty()) {
        const Entry e = heap.top();
        heap.pop();
        const int64_t p = e.pos;
        if (!alive[p] || next[p] < 0 || id[p] != e.left || id[next[p]] != e.right) continue;
        const int64_t q = next[p];
        id[p] = tok_->merges_[e.rank].result;
        alive[q] = false;
        next[p] = next[q];
        if (next[q] >= 0) prev[next[q]] = p;
        push(prev[p]);
        push(p);
    }
    for (int64_t p = 0; p >= 0; p = next[p]) out.push_back(id[p]);
}

void Tokenizer::Encoder::encode_piece(std::string_view piece, std::vector<uint32_t>& out) {
    if (piece.size() == 1) {
        out.push_back(tok_->byte_id_[static_cast<unsigned char>(piece[0])]);
        return;
    }
    if (piece.size() > kShortPiece) {
        merge_long(piece, out);
        return;
    }
    auto it = cache_.find(std::string(piece));
    if (it != cache_.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        return;
    }
    const size_t before = out.size();
    merge_short(piece, out);
    if (cache_.size() >= kMaxCacheEntries) cache_.clear();
    cache_.emplace(std::string(piece), std::vector<uint32_t>(out.begin() + before, out.end()));
}

void Tokenizer::Encoder::encode_ordinary(std::string_view text, std::vector<uint32_t>& out) {
    for_each_pretoken(text, [&](std::string_view piece) { encode_piece(piece, out); });
}

void Tokenizer::Encoder::encode(std::string_view text, std::vector<uint32_t>& out,
                                bool allow_special) {
    if (!allow_special || tok_->specials_.empty()) {
        encode_ordinary(text, out);
        return;
    }
    size_t i = 0;
    while (i < text.size()) {
        // The earliest special token at or after i; the longest on a tie.
        size_t best = std::string_view::npos, best_len = 0;
        uint32_t best_id = 0;
        for (const auto& [s, id] : tok_->specials_) {
            const size_t p = text.find(s, i);
            if (p < best || (p == best && s.size() > best_len)) {
                best = p;
                best_len = s.size();
                best_id = id;
            }
        }
        if (best == std::string_view::npos) {
            encode_ordinary(text.substr(i), out);
            return;
        }
        encode_ordinary(text.substr(i, best - i), out);
        out.push_back(best_id);
        i = best + best_len;
    }
}

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
