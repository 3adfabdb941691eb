#include "train/generate.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numeric>
#include <optional>

#include "core/error.h"
#include "data/file_io.h"
#include "data/tokenizer.h"
#include "model/model.h"
#include "train/checkpoint.h"

namespace apiary::train {

namespace {

// The run's tokenizer, checked against the hash its checkpoint recorded;
// none for byte-level checkpoints from before the token loader.
std::optional<data::Tokenizer> run_tokenizer(const GenerateOptions& o, const CheckpointRef& ck,
                                             const core::ModelSpec& spec) {
    const std::string where = ck.dir;
    const std::string name = ck.meta.value("tokenizer", "");
    if (name == "byte" && o.tokenizer.empty()) return std::nullopt;
    if (name.empty() && o.tokenizer.empty()) {
        throw IoError(
            fmt::format("{}: the run saved no tokenizer (it trained on data.sources "
                        "without data.tokenizer_file); pass --tokenizer FILE, the "
                        "shards' tokenizer.json",
                        where));
    }
    const std::string path =
        o.tokenizer.empty() ? (std::filesystem::path(o.run_dir) / name).string() : o.tokenizer;
    data::Tokenizer tok = data::Tokenizer::load(path);
    const std::string want = ck.meta.value("tokenizer_hash", "");
    if (!want.empty() && data::hex64(tok.hash()) != want) {
        throw DataError(
            fmt::format("{}: tokenizer hash {}, but the checkpoint was trained with "
                        "{} ({}); use the run's own tokenizer",
                        path, data::hex64(tok.hash()), want, where));
    }
    if (int64_t(tok.vocab_size()) > spec.vocab_size) {
        throw DataError(fmt::format("{}: {} tokens, more than the model's {} ({})", path,
                                    tok.vocab_size(), spec.vocab_size, where));
    }
    return tok;
}

void check_options(const GenerateOptions& o) {
    // A range check lets NaN through (every comparison with it is false).
    if (!std::isfinite(o.temperature) || o.temperature < 0) {
        throw ConfigError(
            fmt::format("--temperature = {}: give a number >= 0 (0: greedy)", o.temperature));
    }
    if (o.prompt.empty()) throw ConfigError("--prompt is empty; give at least one character");
    if (o.tokens < 0) throw ConfigError(fmt::format("--tokens = {} must be >= 0", o.tokens));
}

}  // namespace

int sample_token(const std::vector<float>& logits, double temperature, int top_k,
                 const core::Philox& rng, uint64_t index) {
    const int V = int(logits.size());
    if (temperature <= 0)
        return int(std::max_element(logits.begin(), logits.end()) - logits.begin());
    std::vector<int> order(V);
    std::iota(order.begin(), order.end(), 0);
    const int k = (top_k > 0 && top_k < V) ? top_k : V;
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](int a, int b) { return logits[a] > logits[b]; });
    const double mx = logits[order[0]];
    std::vector<double> p(k);
    double sum = 0;
    for (int i = 0; i < k; ++i) sum += (p[i] = std::exp((logits[order[i]] - mx) / temperature));
    double u = rng.uniform_f64(index) * sum;
    for (int i = 0; i < k; ++i) {
        if ((u -= p[i]) <= 0) return order[i];
    }
    return order[k - 1];
}

void generate(const GenerateOptions& o, const std::function<void(std::string_view)>& emit) {
    check_options(o);
    const CheckpointRef ckpt = latest_checkpoint(o.run_dir);
    const core::ModelSpec spec = spec_from_json(ckpt.meta.at("model"), ckpt.dir);
    const std::optional<data::Tokenizer> tok = run_tokenizer(o, ckpt, spec);
    const int64_t T =
        std::min<int64_t>(spec.max_seq_len, ckpt.meta.value("seq_len", int64_t(spec.max_seq_len)));
    model::Transformer model(spec, 1, T);
    load_weights(ckpt, model);

    std::vector<int32_t> ids;
    if (tok) {
        for (uint32_t id : tok->encode(o.prompt)) ids.push_back(int32_t(id));
    } else {
        for (char ch : o.prompt) ids.push_back(int32_t(uint8_t(ch)));
    }
    emit(o.prompt);
    std::vector<float> logits(size_t(spec.vocab_size));
    // Ids past the tokenizer's (a padded model.vocab_size) are never drawn.
    const size_t V = std::min(tok ? tok->vocab_size() : size_t(256), size_t(spec.vocab_size));
    const core::Philox rng(o.seed, 0x67656e);
    for (int i = 0; i < o.tokens; ++i) {
        // The model sees at most the length it was trained on: the most
        // recent tokens.
        const int64_t n = std::min<int64_t>(int64_t(ids.size()), T);
        logits.resize(size_t(spec.vocab_size));
        model.last_logits(logits.data(), ids.data() + ids.size() - n, n);
        logits.resize(V);
        const int next = sample_token(logits, o.temperature, o.top_k, rng, uint64_t(i));
        ids.push_back(next);
        if (tok) {
            emit(tok->token_bytes(uint32_t(next)));
        } else {
            const char ch = char(next);
            emit(std::string_view(&ch, 1));
        }
    }
}

}  // namespace apiary::train
