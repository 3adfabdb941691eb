#include "data/bpe_train.h"

#include <omp.h>

#include <algorithm>
#include <queue>

#include "core/error.h"
#include "data/pretokenize.h"

namespace apiary::data {

namespace {

constexpr size_t kChunkBytes = 1 << 20;  // parallel pre-tokenization grain
constexpr size_t kParallelWords = 256;   // merges touching more words go parallel

inline uint64_t key(uint32_t a, uint32_t b) { return (uint64_t(a) << 32) | b; }

struct HeapItem {
    int64_t count;
    uint64_t pair;
    // Max-heap on count; on a tie the smaller pair key comes first.
    bool operator<(const HeapItem& o) const {
        return count != o.count ? count < o.count : pair > o.pair;
    }
};

// Replaces every non-overlapping (a, b), left to right, by c.
void merge_word(std::vector<uint32_t>& w, uint32_t a, uint32_t b, uint32_t c) {
    size_t out = 0;
    for (size_t i = 0; i < w.size();) {
        if (i + 1 < w.size() && w[i] == a && w[i + 1] == b) {
            w[out++] = c;
            i += 2;
        } else {
            w[out++] = w[i++];
        }
    }
    w.resize(out);
}

}  // namespace

BpeTrainer::BpeTrainer(BpeTrainOptions options) : options_(std::move(options)) {
    if (options_.vocab_size < 256 + options_.specials.size()) {
        throw ConfigError(
            fmt::format("tokenizer: vocab size {} is below 256 bytes + {} special "
                        "tokens; pass a larger --vocab-size",
                        options_.vocab_size, options_.specials.size()));
    }
}

void BpeTrainer::count_chunk(std::string_view text,
                             std::unordered_map<std::string, uint64_t>& out) const {
    // Cut special tokens out first so they never become part of a word.
    size_t i = 0;
    while (i < text.size()) {
        size_t next = text.size(), len = 0;
        for (const auto& s : options_.specials) {
            const size_t p = text.find(s, i);
            if (p < next) {
                next = p;
                len = s.size();
            }
        }
        for_each_pretoken(text.substr(i, next - i),
                          [&](std::string_view piece) { ++out[std::string(piece)]; });
        i = next + len;
    }
}

void BpeTrainer::add_text(std::string_view text) {
    std::vector<size_t> cuts{0};
    while (cuts.back() < text.size()) {
        cuts.push_back(safe_split_point(text, std::min(text.size(), cuts.back() + kChunkBytes)));
    }
    const size_t chunks = cuts.size() - 1;
    if (chunks <= 1) {  // not worth a parallel region
        count_chunk(text, words_);
        return;
    }
    const int threads = options_.num_threads > 0 ? options_.num_threads : omp_get_max_threads();
    std::vector<std::unordered_map<std::string, uint64_t>> local(static_cast<size_t>(threads));
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
    for (size_t c = 0; c < chunks; ++c) {
        count_chunk(text.substr(cuts[c], cuts[c + 1] - cuts[c]),
                    local[static_cast<size_t>(omp_get_thread_num())]);
    }
    for (auto& m : local) {
        for (auto& [w, n] : m) words_[w] += n;
    }
}

Tokenizer BpeTrainer::train() const {
    const int threads = options_.num_threads > 0 ? options_.num_threads : omp_get_max_threads();
    // Words in a fixed order (sorted), so that results never depend on hash order.
    std::vector<std::pair<std::string, uint64_t>> sorted(words_.begin(), words_.end());
    std::sort(sorted.begin(), sorted.end());
    std::vector<std::vector<uint32_t>> words(sorted.size());
    std::vector<int64_t> counts(sorted.size());
    for (size_t w = 0; w < sorted.size(); ++w) {
        for (unsigned char ch : sorted[w].first) words[w].push_back(ch);
        counts[w] = static_cast<int64_t>(sorted[w].second);
    }
    sorted.clear();

    std::vector<std::string> vocab(256);
    for (int b = 0; b < 256; ++b) vocab[b] = std::string(1, static_cast<char>(b));
    std::unordered_map<std::string, uint32_t> ids;
    for (uint32_t b = 0; b < 256; ++b) ids[vocab[b]] = b;

    std::unordered_map<uint64_t, int64_t> pair_count;
    std::unordered_map<uint64_t, std::vector<uint32_t>> where;
    for (uint32_t w = 0; w < words.size(); ++w) {
        for (size_t i = 0; i + 1 < words[w].size(); ++i) {
            const uint64_t p = key(words[w][i], words[w][i + 1]);
            pair_count[p] += counts[w];
            auto& list = where[p];
            if (list.empty() || list.back() != w) list.push_back(w);
        }
    }
    std::priority_queue<HeapItem> heap;
    for (const auto& [p, n] : pair_count) heap.push({n, p});

    std::vector<Merge> merges;
    const size_t target = options_.vocab_size - options_.specials.size();
    std::vector<uint32_t> stamp(words.size(), UINT32_MAX);
    std::vector<uint32_t> touched;
    while (vocab.size() < target && !heap.empty()) {
        const HeapItem top = heap.top();
        heap.pop();
        const auto it = pair_count.find(top.pair);
        const int64_t actual = it == pair_count.end() ? 0 : it->second;
        if (actual != top.count) {  // stale entry: requeue with the true count
            if (actual > 0) heap.push({actual, top.pair});
            continue;
        }
        if (actual <= 0) continue;
        const uint32_t a = static_cast<uint32_t>(top.pair >> 32);
        const uint32_t b = static_cast<uint32_t>(top.pair);
        const std::string merged = vocab[a] + vocab[b];
        uint32_t c;
        if (auto found = ids.find(merged); found != ids.end()) {
            c = found->second;  // the same bytes reached by another split
        } else {
            c = static_cast<uint32_t>(vocab.size());
            vocab.push_back(merged);
            ids.emplace(merged, c);
        }
        const uint32_t merge_no = static_cast<uint32_t>(merges.size());
        merges.push_back({a, b, c});

        touched.clear();
        for (uint32_t w : where[top.pair]) {
            if (stamp[w] != merge_no) {
                stamp[w] = merge_no;
                touched.push_back(w);
            }
        }
        // Each touched word's pairs are subtracted, the word rewritten, and its
        // new pairs added back; per-thread deltas are summed, so the outcome
        // does not depend on how words were split among threads.
        const int nt = touched.size() >= kParallelWords ? threads : 1;
        std::vector<std::unordered_map<uint64_t, int64_t>> delta(static_cast<size_t>(nt));
        std::vector<std::vector<std::pair<uint64_t, uint32_t>>> fresh(static_cast<size_t>(nt));
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
        for (size_t t = 0; t < touched.size(); ++t) {
            const size_t me = static_cast<size_t>(omp_get_thread_num());
            const uint32_t w = touched[t];
            auto& word = words[w];
            for (size_t i = 0; i + 1 < word.size(); ++i) {
                delta[me][key(word[i], word[i + 1])] -= counts[w];
            }
            merge_word(word, a, b, c);
            for (size_t i = 0; i + 1 < word.size(); ++i) {
                const uint64_t p = key(word[i], word[i + 1]);
                delta[me][p] += counts[w];
                if (word[i] == c || word[i + 1] == c) fresh[me].emplace_back(p, w);
            }
        }
        std::unordered_map<uint64_t, int64_t> total;
        for (auto& d : delta) {
            for (const auto& [p, n] : d) total[p] += n;
        }
        for (const auto& [p, n] : total) {
            if (n == 0) continue;
            const int64_t now = (pair_count[p] += n);
            if (n > 0) heap.push({now, p});
        }
        for (auto& f : fresh) {
            for (const auto& [p, w] : f) {
                auto& list = where[p];
                if (list.empty() || list.back() != w) list.push_back(w);
            }
        }
    }
    std::vector<std::pair<std::string, uint32_t>> specials;
    for (const auto& s : options_.specials) {
        specials.emplace_back(s, static_cast<uint32_t>(vocab.size()));
        vocab.push_back(s);
    }
    return Tokenizer(std::move(vocab), std::move(merges), std::move(specials));
}

Tokenizer train_bpe_on_files(const std::vector<std::string>& inputs,
                             const BpeTrainOptions& options, const DocumentOptions& documents,
                             size_t* bytes_read, size_t* distinct_words) {
    BpeTrainer trainer(options);
    size_t bytes = 0;
    std::string batch;
    const std::string separator = options.specials.empty() ? "" : options.specials.front();
    for (const auto& path : inputs) {
        for_each_block(path, documents, [&](std::string_view block) {
            bytes += block.size();
            batch.append(block);
            batch.append(separator);
            if (batch.size() >= (8u << 20)) {
                trainer.add_text(batch);
                batch.clear();
            }
        });
    }
    trainer.add_text(batch);
    if (bytes_read) *bytes_read = bytes;
    if (distinct_words) *distinct_words = trainer.distinct_words();
    return trainer.train();
}

}  // namespace apiary::data
