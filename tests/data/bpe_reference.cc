#include "bpe_reference.h"

#include "data/pretokenize.h"

namespace apiary::data::testing {

ReferenceEncoder::ReferenceEncoder(const Tokenizer& tok) : tok_(&tok) {
    for (uint32_t r = 0; r < tok.merges().size(); ++r) {
        rank_.emplace(std::make_pair(tok.merges()[r].left, tok.merges()[r].right), r);
    }
    bool have[256] = {};
    for (uint32_t id = 0; id < tok.vocab_size(); ++id) {
        const std::string& t = tok.token_bytes(id);
        bool special = false;
        for (const auto& s : tok.specials()) special |= s.second == id;
        const auto b = t.size() == 1 ? static_cast<unsigned char>(t[0]) : 0;
        if (t.size() == 1 && !special && !have[b]) {
            byte_id_[b] = id;
            have[b] = true;
        }
    }
}

std::vector<uint32_t> reference_encode(const Tokenizer& tok, std::string_view text,
                                       MergeOrder order) {
    return ReferenceEncoder(tok).encode(text, order);
}

std::vector<uint32_t> ReferenceEncoder::encode(std::string_view text, MergeOrder order) const {
    const Tokenizer& tok = *tok_;
    std::vector<uint32_t> out;
    for_each_pretoken(text, [&](std::string_view piece) {
        std::vector<uint32_t> ids;
        for (unsigned char c : piece) ids.push_back(byte_id_[c]);
        while (ids.size() > 1) {
            size_t best = ids.size();
            uint32_t best_rank = UINT32_MAX;
            for (size_t k = 0; k + 1 < ids.size(); ++k) {
                const auto it = rank_.find({ids[k], ids[k + 1]});
                if (it == rank_.end()) continue;
                const bool better = order == MergeOrder::lowest_rank_rightmost
                                        ? it->second <= best_rank
                                        : it->second < best_rank;
                if (better) {
                    best = k;
                    best_rank = it->second;
                }
                if (order == MergeOrder::leftmost_mergeable) break;
            }
            if (best == ids.size()) break;
            ids[best] = tok.merges()[best_rank].result;
            ids.erase(ids.begin() + static_cast<ptrdiff_t>(best) + 1);
        }
        out.insert(out.end(), ids.begin(), ids.end());
    });
    return out;
}

}  // namespace apiary::data::testing
