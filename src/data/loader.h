#pragma once
// The training data loader: memory-mapped token shards -> batches.
//
//   LoaderOptions o = LoaderOptions::from_config(config, dp_rank, dp_size, "train");
//   Loader loader(o);
//   while (...) {
//       const Batch& b = loader.next_batch();   // b.tokens: (b.B, b.T + 1) int32
//       // inputs are b.row(i)[0 .. T), targets b.row(i)[1 .. T]
//   }
//   nlohmann::json s = loader.state();          // save with the checkpoint
//   loader.restore(s);                          // later: the same batches follow
//
// Sample stream. Every source (a `data prepare` output directory) is cut into
// windows of T_max + 1 tokens at stride T_max inside each shard (T_max =
// seq_len). Global position g of the stream picks a source by the Mixer
// (exact proportions, sampler.h) and that source's next sample through its
// shuffle: draw n of source s is window Permutation(N_s, seed, s, epoch)(n mod
// N_s) with epoch = n / N_s, so every epoch is a fresh permutation over all of
// the source's shards. Step t uses positions [t * dp_size * B, (t + 1) *
// dp_size * B); rank r takes the r-th run of B of them, so ranks are disjoint
// and together cover each epoch.
//
// Curriculum. With curriculum_start > 0, step t has sequence length T_t
// growing linearly from curriculum_start to seq_len over curriculum_steps
// steps. mode "tokens" keeps tokens per batch constant: T_t is rounded down
// to a divisor of seq_len, and each window is cut into seq_len / T_t rows of
// T_t + 1 tokens, so B_t = B * seq_len / T_t. mode "batch" keeps B rows and
// uses the first T_t + 1 tokens of each window. Either way a step consumes B
// windows per rank, so the sample stream does not depend on the curriculum.
//
// A prefetch thread builds batches ahead into a bounded queue. state() is the
// position after the last batch next_batch() returned, never a prefetched one.

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "data/remote.h"
#include "data/sampler.h"
#include "data/shard.h"

namespace apiary::core {
class Config;
}

namespace apiary::data {

struct SourceSpec {
    std::string path;  // directory with manifest.json (or the file), or an http(s)/s3 URL of one
    double weight = 1.0;
};

// "dirA:0.7,dirB:0.3" (a weight after the last ':' is optional, default 1).
std::vector<SourceSpec> parse_sources(const std::string& text);

enum class CurriculumMode { tokens, batch };

struct LoaderOptions {
    std::vector<SourceSpec> sources;
    std::string split = "train";  // "train" or "val"
    int64_t batch_size = 8;       // B: windows per rank per step
    int64_t seq_len = 128;        // T_max
    uint64_t seed = 1234;
    int dp_rank = 0, dp_size = 1;
    bool shuffle = true;           // false: windows in shard order (e.g. a fixed eval set)
    int64_t curriculum_start = 0;  // 0: no curriculum
    int64_t curriculum_steps = 0;
    CurriculumMode curriculum_mode = CurriculumMode::tokens;
    int prefetch = 4;            // batches queued ahead; 0: no thread
    bool verify = true;          // check a shard's checksum and tokens before its first use
    std::string tokenizer_hash;  // hex; if set, every manifest must match
    RemoteOptions remote;        // cache for http(s) and s3 sources (data/remote.h)

    // data.* keys plus train.batch_size and train.seq_len (data/keys.h).
    static LoaderOptions from_config(const core::Config& config, int dp_rank, int dp_size,
                                     const std::string& split);
};

struct Batch {
    int64_t step = 0;
    int64_t B = 0, T = 0;
    std::vector<int32_t> tokens;  // (B, T + 1)
    const int32_t* row(int64_t i) const { return tokens.data() + i * (T + 1); }
};

class Loader {
  public:
    explicit Loader(LoaderOptions options);
    ~Loader();
    Loader(const Loader&) = delete;
    Loader& operator=(const Loader&) = delete;

    // The next batch; valid until the following call. Rethrows any error the
    // prefetch thread met (e.g. an unreadable shard).
    const Batch& next_batch();

    // (B_t, T_t) that step t will have.
    std::pair<int64_t, int64_t> shape_at(int64_t step) const;
    int64_t max_batch_tokens() const;                // largest B_t * (T_t + 1) over all steps
    int64_t step() const { return consumed_.step; }  // steps returned so far

    nlohmann::json state() const;
    void restore(const nlohmann::json& state);

    size_t num_sources() const { return sources_.size(); }
    const Manifest& manifest(size_t s) const { return sources_[s].manifest; }
    // The unigram distribution (V probabilities, V = the manifests' vocab
    // size) of the stream: each source's token frequencies over its first
    // max_tokens tokens in shard order, mixed by the source weights. The
    // trainer's baseline: the loss of the best model that ignores context.
    std::vector<double> unigram(uint64_t max_tokens_per_source) const;
    // Windows of source s in this split (the trainer bounds train.eval_batches by them).
    uint64_t samples_in_source(size_t s) const { return sources_[s].windows; }

  private:
    struct Source {
        Manifest manifest;
        std::vector<ShardReader> shards;
        std::vector<uint64_t> first_window;  // prefix sums of windows per shard
        std::vector<std::string> xxh64;      // expected checksum per shard
        // Shards are checksummed lazily, on first use, so that opening
        // thousands of shards reads headers only. Only the one thread that
        // produces batches touches this.
        mutable std::vector<bool> verified;
        uint64_t windows = 0;
    };
    struct Cursor {
        int64_t step = 0;
        uint64_t position = 0;
        std::vector<uint64_t> drawn;
    };
    struct Item {
        Batch batch;
        Cursor after;
    };

    void open_sources();
    Item produce(Cursor& cursor) const;
    void read_window(size_t source, uint64_t draw, int32_t* out) const;
    void start_thread();
    void stop_thread();
    nlohmann::json fingerprint() const;

    LoaderOptions opt_;
    std::vector<Source> sources_;
    Cursor consumed_, produced_;
    Batch current_;

    std::thread thread_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<Item> queue_;
    std::exception_ptr error_;
    bool stop_ = false;
};

}  // namespace apiary::data
