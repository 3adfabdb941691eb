#include "data/loader.h"

#include <algorithm>
#include <charconv>

#include "core/error.h"
#include "data/file_io.h"

namespace apiary::data {

std::vector<SourceSpec> parse_sources(const std::string& text) {
    std::vector<SourceSpec> out;
    size_t pos = 0;
    while (pos <= text.size()) {
        size_t end = text.find(',', pos);
        if (end == std::string::npos) end = text.size();
        std::string item = text.substr(pos, end - pos);
        pos = end + 1;
        while (!item.empty() && item.front() == ' ') item.erase(0, 1);
        while (!item.empty() && item.back() == ' ') item.pop_back();
        if (item.empty()) continue;
        SourceSpec s{item, 1.0};
        const size_t colon = item.rfind(':');
        if (colon != std::string::npos) {
            const std::string w = item.substr(colon + 1);
            double v = 0;
            const auto r = std::from_chars(w.data(), w.data() + w.size(), v);
            if (r.ec == std::errc() && r.ptr == w.data() + w.size()) {
                if (!(v > 0)) {
                    throw ConfigError(
                        fmt::format("data.sources: weight '{}' of '{}' must be > 0", w, item));
                }
                s = {item.substr(0, colon), v};
            }
        }
        out.push_back(s);
        if (end == text.size()) break;
    }
    return out;
}

Loader::Loader(LoaderOptions options) : opt_(std::move(options)) {
    if (opt_.sources.empty()) {
        throw ConfigError(
            "loader: no data sources; set data.sources = \"DIR[:weight],...\" to "
            "directories made by `apiary data prepare`");
    }
    if (opt_.batch_size < 1 || opt_.seq_len < 1 || opt_.dp_size < 1 || opt_.dp_rank < 0 ||
        opt_.dp_rank >= opt_.dp_size) {
        throw ConfigError(
            fmt::format("loader: batch_size {}, seq_len {}, dp_rank {} of dp_size "
                        "{} is not a valid layout",
                        opt_.batch_size, opt_.seq_len, opt_.dp_rank, opt_.dp_size));
    }
    if (opt_.curriculum_start > opt_.seq_len) {
        throw ConfigError(fmt::format("loader: data.curriculum_start {} exceeds train.seq_len {}",
                                      opt_.curriculum_start, opt_.seq_len));
    }
    open_sources();
    consumed_.drawn.assign(sources_.size(), 0);
    produced_ = consumed_;
    start_thread();
}

Loader::~Loader() { stop_thread(); }

void Loader::open_sources() {
    std::unique_ptr<ShardCache> cache;
    for (const auto& spec : opt_.sources) {
        Source src;
        const bool remote = is_url(spec.path);
        if (const size_t colon = spec.path.find("://"); !remote && colon != std::string::npos) {
            throw ConfigError(fmt::format(
                "data source '{}': the scheme '{}' is not supported; a source is a local "
                "directory (or its manifest.json), an http:// or https:// URL, or an s3:// URL",
                spec.path, spec.path.substr(0, colon)));
        }
        if (remote && !cache) cache = std::make_unique<ShardCache>(opt_.remote);
        src.manifest = remote ? cache->manifest(spec.path) : Manifest::load(spec.path);
        const auto& m = src.manifest;
        if (!opt_.tokenizer_hash.empty() && m.tokenizer_hash != opt_.tokenizer_hash) {
            throw DataError(
                fmt::format("'{}/manifest.json' was tokenized with tokenizer {}, but "
                            "the configured tokenizer has hash {}; re-run `apiary "
                            "data prepare` with it",
                            m.dir, m.tokenizer_hash, opt_.tokenizer_hash));
        }
        if (!sources_.empty() && m.tokenizer_hash != sources_[0].manifest.tokenizer_hash) {
            throw DataError(
                fmt::format("sources '{}' and '{}' were tokenized with different "
                            "tokenizers ({} vs {})",
                            sources_[0].manifest.dir, m.dir, sources_[0].manifest.tokenizer_hash,
                            m.tokenizer_hash));
        }
        src.first_window.push_back(0);
        for (const auto& info : m.split(opt_.split)) {
            // A remote shard is checked against the manifest as it enters the cache.
            ShardReader r(remote ? cache->get(m.shard_path(info), info.bytes, info.xxh64)
                                 : m.shard_path(info));
            check_against_manifest(r, m, info);
            src.xxh64.push_back(info.xxh64);
            // Checked on first use (checksum, every token in the vocabulary);
            // without data.verify each window is checked against the
            // vocabulary instead (read_window).
            src.verified.push_back(!opt_.verify);
            const uint64_t w =
                r.num_tokens() > uint64_t(opt_.seq_len) ? (r.num_tokens() - 1) / opt_.seq_len : 0;
            src.windows += w;
            src.first_window.push_back(src.windows);
            src.shards.push_back(std::move(r));
        }
        if (src.windows == 0) {
            throw DataError(
                fmt::format("source '{}' has no {} sample of {} tokens (seq_len + 1); "
                            "prepare more data or lower train.seq_len",
                            spec.path, opt_.split, opt_.seq_len + 1));
        }
        sources_.push_back(std::move(src));
    }
}

std::pair<int64_t, int64_t> Loader::shape_at(int64_t step) const {
    const int64_t tmax = opt_.seq_len, b = opt_.batch_size;
    if (opt_.curriculum_start <= 0 || step >= opt_.curriculum_steps) return {b, tmax};
    const int64_t start = opt_.curriculum_start;
    const int64_t len = start + (tmax - start) * step / std::max<int64_t>(1, opt_.curriculum_steps);
    if (opt_.curriculum_mode == CurriculumMode::batch) return {b, std::max<int64_t>(1, len)};
    int64_t t = 1;  // the largest divisor of tmax not above len
    for (int64_t d = 1; d * d <= tmax; ++d) {
        if (tmax % d) continue;
        if (d <= len) t = std::max(t, d);
        if (tmax / d <= len) t = std::max(t, tmax / d);
    }
    return {b * (tmax / t), t};
}

int64_t Loader::max_batch_tokens() const {
    int64_t best = opt_.batch_size * (opt_.seq_len + 1);
    for (int64_t s = 0; opt_.curriculum_start > 0 && s < opt_.curriculum_steps; ++s) {
        const auto [b, t] = shape_at(s);
        best = std::max(best, b * (t + 1));
    }
    return best;
}

void Loader::read_window(size_t s, uint64_t draw, int32_t* out) const {
    const Source& src = sources_[s];
    const uint64_t epoch = draw / src.windows;
    uint64_t idx = draw % src.windows;
    if (opt_.shuffle) idx = Permutation(src.windows, opt_.seed, (uint64_t(s) << 40) | epoch)(idx);
    const size_t k = static_cast<size_t>(
        std::upper_bound(src.first_window.begin(), src.first_window.end(), idx) -
        src.first_window.begin() - 1);
    if (!src.verified[k]) {
        src.shards[k].verify(src.xxh64[k]);
        src.verified[k] = true;
    }
    const uint64_t first = (idx - src.first_window[k]) * uint64_t(opt_.seq_len);
    src.shards[k].copy_tokens(first, uint64_t(opt_.seq_len) + 1, out);
    if (!opt_.verify) {
        check_tokens_in_vocab(src.shards[k], first, out, uint64_t(opt_.seq_len) + 1,
                              src.manifest.vocab_size, "data.verify = false");
    }
}

Loader::Item Loader::produce(Cursor& cur) const {
    Item item;
    const auto [bt, t] = shape_at(cur.step);
    const int64_t tmax = opt_.seq_len, b = opt_.batch_size;
    item.batch.step = cur.step;
    item.batch.B = bt;
    item.batch.T = t;
    item.batch.tokens.resize(size_t(bt * (t + 1)));
    std::vector<double> weights;
    for (const auto& s : opt_.sources) weights.push_back(s.weight);
    Mixer mixer(weights);
    mixer.restore(cur.position, cur.drawn);
    std::vector<int32_t> window(size_t(tmax + 1));
    const int64_t rows_per_window = bt / b;
    const int64_t mine = int64_t(opt_.dp_rank) * b;
    for (int64_t g = 0; g < int64_t(opt_.dp_size) * b; ++g) {
        const size_t s = mixer.next();
        if (g < mine || g >= mine + b) continue;  // another rank's sample
        const uint64_t draw = mixer.drawn()[s] - 1;
        read_window(s, draw, window.data());
        const int64_t j = g - mine;
        for (int64_t r = 0; r < rows_per_window; ++r) {
            std::copy_n(window.data() + r * t, t + 1,
                        item.batch.tokens.data() + (j * rows_per_window + r) * (t + 1));
        }
    }
    cur.step += 1;
    cur.position = mixer.position();
    cur.drawn = mixer.drawn();
    item.after = cur;
    return item;
}

void Loader::start_thread() {
    stop_ = false;
    error_ = nullptr;
    if (opt_.prefetch <= 0) return;
    thread_ = std::thread([this] {
        try {
            for (;;) {
                Cursor cur;
                {
                    std::unique_lock lock(mu_);
                    cv_.wait(lock, [&] { return stop_ || int(queue_.size()) < opt_.prefetch; });
                    if (stop_) return;
                    cur = produced_;
                }
                Item item = produce(cur);
                std::lock_guard lock(mu_);
                if (stop_) return;
                produced_ = cur;
                queue_.push_back(std::move(item));
                cv_.notify_all();
            }
        } catch (...) {
            std::lock_guard lock(mu_);
            error_ = std::current_exception();
            cv_.notify_all();
        }
    });
}

void Loader::stop_thread() {
    {
        std::lock_guard lock(mu_);
        stop_ = true;
        cv_.notify_all();
    }
    if (thread_.joinable()) thread_.join();
    queue_.clear();
}

const Batch& Loader::next_batch() {
    Item item;
    if (opt_.prefetch <= 0) {
        item = produce(produced_);
    } else {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return !queue_.empty() || error_; });
        if (queue_.empty()) std::rethrow_exception(error_);
        item = std::move(queue_.front());
        queue_.pop_front();
        cv_.notify_all();
    }
    consumed_ = item.after;
    current_ = std::move(item.batch);
    return current_;
}

std::vector<double> Loader::unigram(uint64_t max_tokens_per_source) const {
    const uint64_t V = sources_.front().manifest.vocab_size;
    std::vector<double> p(V, 0.0);
    double total_weight = 0;
    for (const auto& s : opt_.sources) total_weight += s.weight;
    std::vector<int32_t> buf(1 << 16);
    for (size_t s = 0; s < sources_.size(); ++s) {
        std::vector<uint64_t> count(V, 0);
        uint64_t n = 0;
        for (const auto& shard : sources_[s].shards) {
            for (uint64_t at = 0; at < shard.num_tokens() && n < max_tokens_per_source;) {
                const uint64_t k = std::min<uint64_t>(
                    {buf.size(), shard.num_tokens() - at, max_tokens_per_source - n});
                shard.copy_tokens(at, k, buf.data());
                for (uint64_t i = 0; i < k; ++i) {
                    // Unverified shards may hold ids past the vocabulary; the
                    // loader refuses them when it reaches them.
                    if (uint64_t(buf[i]) < V) count[size_t(buf[i])] += 1;
                }
                at += k;
                n += k;
            }
        }
        const double w = opt_.sources[s].weight / total_weight / double(std::max<uint64_t>(1, n));
        for (uint64_t v = 0; v < V; ++v) p[v] += w * double(count[v]);
    }
    return p;
}

nlohmann::json Loader::fingerprint() const {
    nlohmann::json sources = nlohmann::json::array();
    for (size_t s = 0; s < sources_.size(); ++s) {
        sources.push_back({{"path", opt_.sources[s].path},
                           {"weight", opt_.sources[s].weight},
                           {"windows", sources_[s].windows}});
    }
    return {{"sources", sources},
            {"split", opt_.split},
            {"seq_len", opt_.seq_len},
            {"seed", opt_.seed},
            {"shuffle", opt_.shuffle}};
}

nlohmann::json Loader::state() const {
    return {{"version", 1},
            {"step", consumed_.step},
            {"position", consumed_.position},
            {"drawn", consumed_.drawn},
            {"fingerprint", fingerprint()}};
}

void Loader::restore(const nlohmann::json& state) {
    Cursor cur;
    try {
        if (state.at("version").get<int>() != 1) throw ConfigError("loader state: unknown version");
        const auto want = fingerprint();
        const auto& got = state.at("fingerprint");
        for (const auto& [k, v] : want.items()) {
            if (!got.contains(k) || got[k] != v) {
                throw ConfigError(
                    fmt::format("loader state was saved with {} = {}, this run has "
                                "{}; resume with the same data settings",
                                k, got.contains(k) ? got[k].dump() : "nothing", v.dump()));
            }
        }
        cur.step = state.at("step").get<int64_t>();
        cur.position = state.at("position").get<uint64_t>();
        cur.drawn = state.at("drawn").get<std::vector<uint64_t>>();
    } catch (const nlohmann::json::exception& e) {
        throw ConfigError(fmt::format("loader state is malformed: {}", e.what()));
    }
    // Checks the counts against the weights before anything changes.
    std::vector<double> weights;
    for (const auto& s : opt_.sources) weights.push_back(s.weight);
    Mixer(weights).restore(cur.position, cur.drawn);
    stop_thread();
    consumed_ = produced_ = cur;
    start_thread();
}

}  // namespace apiary::data
