// Encoding one pre-token with byte-level BPE: merge the lowest-ranked
// adjacent pair, leftmost on ties, until no pair has a merge (Hugging Face's
// BPE model and tiktoken agree on this order).
//
// On text whose words repeat (the Bible) a cache answers almost every
// pre-token; on text whose words rarely repeat (identifiers, names, other
// scripts) the merge loop is the cost, and within it the pair lookups. So:
//  * pairs are found in an open-addressing table (PairTable), not a
//    std::unordered_map: a multiply and one cache line per lookup;
//  * the merged id is the rank plus a constant in most vocabularies, so
//    applying a merge reads nothing else;
//  * pieces up to kShortPiece bytes merge in fixed arrays on the stack with
//    a linear scan for the best pair over a bit mask of live symbols (n is
//    small; nothing is allocated or shifted);
//    longer ones with a heap of candidates over a linked list, O(n log n),
//    in buffers the encoder keeps;
//  * the pre-token cache is direct-mapped, one 64-byte line per entry: a
//    miss costs no allocation, where a node-based map allocated a node, a
//    key and a vector for every new word.

#include <algorithm>
#include <bit>
#include <cstring>

#include "data/pretokenize.h"
#include "data/tokenizer.h"

namespace apiary::data {

namespace {

// Pieces longer than this merge with a heap (O(n log n)); shorter ones with a
// linear scan per merge, which is faster for the short words of real text.
constexpr size_t kShortPiece = 64;
// The cache starts at kMinSlots (16 KiB) and doubles, up to kMaxSlots (2 MiB),
// each time it has missed more than four times its size since it last grew.
constexpr size_t kMinSlots = 256;
constexpr size_t kMaxSlots = size_t(1) << 13;
constexpr uint32_t kNone = UINT32_MAX;

// Hash of a short byte string (at most kSlotBytes): 8 bytes at a time.
uint64_t piece_hash(std::string_view s) {
    uint64_t h = s.size() * 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < s.size(); i += 8) {
        uint64_t w = 0;
        std::memcpy(&w, s.data() + i, std::min<size_t>(8, s.size() - i));
        h = (h ^ w) * 0xff51afd7ed558ccdull;
        h ^= h >> 32;
    }
    return h * 0xc4ceb9fe1a85ec53ull;
}

}  // namespace

void Tokenizer::PairTable::build(const std::vector<Merge>& merges) {
    size_t cap = 4;
    while (cap < merges.size() * 2) cap *= 2;  // load factor at most 1/2
    slots_.assign(cap, kEmpty);
    mask_ = cap - 1;
    shift_ = 64 - std::countr_zero(cap);
    results_.resize(merges.size());
    sequential_ = true;
    first_result_ = merges.empty() ? 0 : merges[0].result;
    for (uint32_t r = 0; r < merges.size(); ++r) {
        const Merge& m = merges[r];
        results_[r] = m.result;
        sequential_ = sequential_ && m.result == first_result_ + r;
        const uint64_t key = (uint64_t(m.left) << 21) | m.right;
        size_t i = (key * 0x9E3779B97F4A7C15ull) >> shift_;
        while (slots_[i] != kEmpty && (slots_[i] >> 21) != key) i = (i + 1) & mask_;
        if (slots_[i] == kEmpty) slots_[i] = (key << 21) | r;
    }
    if (sequential_) results_ = {};
}

void Tokenizer::PairTable::build_bytes(const uint32_t* byte_id) {
    byte_pairs_.resize(256 * 256);
    for (size_t a = 0; a < 256; ++a) {
        for (size_t b = 0; b < 256; ++b) byte_pairs_[(a << 8) | b] = find(byte_id[a], byte_id[b]);
    }
}

void Tokenizer::Encoder::merge_short(std::string_view piece, std::vector<uint32_t>& out) {
    static_assert(kShortPiece <= 64, "live symbols are bits of one word");
    const PairTable& pairs = tok_->pairs_;
    // Symbols stay at their first byte's position; `live` has a bit per
    // symbol, so a merge clears one bit instead of shifting arrays. rank[k]:
    // the rank of merging symbol k with the next live one.
    uint32_t id[kShortPiece], rank[kShortPiece];
    const size_t n = piece.size();
    const auto* bytes = reinterpret_cast<const unsigned char*>(piece.data());
    for (size_t k = 0; k < n; ++k) id[k] = tok_->byte_id_[bytes[k]];
    for (size_t k = 0; k + 1 < n; ++k) rank[k] = pairs.find_bytes(bytes[k], bytes[k + 1]);
    rank[n - 1] = kNone;
    uint64_t live = n == 64 ? ~uint64_t(0) : (uint64_t(1) << n) - 1;
    auto after = [&](size_t k) {  // the next live symbol, or 64
        const uint64_t later = k >= 63 ? 0 : live & ~((uint64_t(2) << k) - 1);
        return later ? size_t(std::countr_zero(later)) : size_t(64);
    };
    while (true) {
        size_t best = 64;
        uint32_t best_rank = kNone;
        for (uint64_t m = live; m; m &= m - 1) {
            const size_t k = size_t(std::countr_zero(m));
            if (rank[k] < best_rank) {  // strict: the leftmost wins a tie
                best_rank = rank[k];
                best = k;
            }
        }
        if (best_rank == kNone) break;
        id[best] = pairs.result(best_rank);
        live &= ~(uint64_t(1) << after(best));
        const size_t next = after(best);
        rank[best] = next < 64 ? pairs.find(id[best], id[next]) : kNone;
        const uint64_t before = live & ((uint64_t(1) << best) - 1);
        if (before) {
            const size_t prev = size_t(63 - std::countl_zero(before));
            rank[prev] = pairs.find(id[prev], id[best]);
        }
    }
    for (uint64_t m = live; m; m &= m - 1) out.push_back(id[std::countr_zero(m)]);
}

void Tokenizer::Encoder::merge_long(std::string_view piece, std::vector<uint32_t>& out) {
    // Symbols in a doubly linked list over the original byte positions; a
    // heap entry is stale when either symbol has changed since it was pushed,
    // so no decrease-key is needed. The position breaks rank ties: symbols
    // keep their order, so the lowest position is the leftmost pair.
    const PairTable& pairs = tok_->pairs_;
    const uint32_t n = uint32_t(piece.size());
    id_.resize(n);
    next_.resize(n);
    prev_.resize(n);
    for (uint32_t k = 0; k < n; ++k) {
        id_[k] = tok_->byte_id_[static_cast<unsigned char>(piece[k])];
        prev_[k] = k - 1;  // kNone for k = 0
        next_[k] = k + 1 < n ? k + 1 : kNone;
    }
    auto later = [](const Candidate& a, const Candidate& b) {
        return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
    };
    heap_.clear();
    auto push = [&](uint32_t p) {
        if (p == kNone || next_[p] == kNone) return;
        const uint32_t r = pairs.find(id_[p], id_[next_[p]]);
        if (r == kNone) return;
        heap_.push_back({r, p, id_[p], id_[next_[p]]});
        std::push_heap(heap_.begin(), heap_.end(), later);
    };
    const auto* bytes = reinterpret_cast<const unsigned char*>(piece.data());
    for (uint32_t k = 0; k + 1 < n; ++k) {
        const uint32_t r = pairs.find_bytes(bytes[k], bytes[k + 1]);
        if (r != kNone) heap_.push_back({r, k, id_[k], id_[k + 1]});
    }
    std::make_heap(heap_.begin(), heap_.end(), later);
    while (!heap_.empty()) {
        std::pop_heap(heap_.begin(), heap_.end(), later);
        const Candidate c = heap_.back();
        heap_.pop_back();
        const uint32_t p = c.pos, q = next_[p];
        // Stale: p or its right neighbour has changed since the push (a
        // symbol merged into its left neighbour has id kNone).
        if (q == kNone || id_[p] != c.left || id_[q] != c.right) continue;
        id_[p] = pairs.result(c.rank);
        next_[p] = next_[q];
        if (next_[q] != kNone) prev_[next_[q]] = p;
        next_[q] = kNone;
        prev_[q] = kNone;
        id_[q] = kNone;
        push(prev_[p]);
        push(p);
    }
    for (uint32_t p = 0; p != kNone; p = next_[p]) out.push_back(id_[p]);
}

void Tokenizer::Encoder::remember(std::string_view piece, const uint32_t* ids, size_t count) {
    if (piece.size() > kSlotBytes || count > kSlotIds) return;
    if (cache_.empty() || (++cache_misses_ > 4 * cache_.size() && cache_.size() < kMaxSlots)) {
        cache_.assign(cache_.empty() ? kMinSlots : cache_.size() * 2, Slot{});
        cache_misses_ = 0;
    }
    Slot& s = cache_[piece_hash(piece) & (cache_.size() - 1)];
    s.len = uint8_t(piece.size());
    s.count = uint8_t(count);
    std::memcpy(s.bytes, piece.data(), piece.size());
    std::memcpy(s.ids, ids, count * sizeof(uint32_t));
}

void Tokenizer::Encoder::encode_piece(std::string_view piece, std::vector<uint32_t>& out) {
    const size_t n = piece.size();
    if (n == 1) {
        out.push_back(tok_->byte_id_[static_cast<unsigned char>(piece[0])]);
        return;
    }
    if (n > kShortPiece) {
        merge_long(piece, out);
        return;
    }
    if (n <= kSlotBytes && !cache_.empty()) {
        const Slot& s = cache_[piece_hash(piece) & (cache_.size() - 1)];
        if (s.len == n && std::memcmp(s.bytes, piece.data(), n) == 0) {
            for (size_t k = 0; k < s.count; ++k) out.push_back(s.ids[k]);
            return;
        }
    }
    const size_t before = out.size();
    merge_short(piece, out);
    remember(piece, out.data() + before, out.size() - before);
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

}  // namespace apiary::data
