// `apiary generate --run DIR --prompt TEXT`: samples from a run's latest
// checkpoint with temperature, top-k and a seed, encoding and decoding with
// the tokenizer saved in the run directory (runs from before the token
// loader used raw bytes).

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <optional>

#include "cli/command.h"
#include "core/error.h"
#include "core/rng.h"
#include "data/file_io.h"
#include "data/tokenizer.h"
#include "model/model.h"
#include "train/checkpoint.h"
#include "train/train_data.h"

namespace apiary::cli {

namespace {

struct GenerateArgs {
    std::string run_dir;
    std::string tokenizer;  // overrides the run's tokenizer.json
    std::string prompt = "\n";
    int tokens = 300;
    double temperature = 0.8;
    int top_k = 40;
    uint64_t seed = 1;
};

// Samples an index from logits (V) with temperature and top-k; temperature
// 0 is greedy.
int sample(std::vector<float>& logits, double temperature, int top_k, const core::Philox& rng,
           uint64_t index) {
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

// The run's tokenizer, checked against the hash its checkpoint recorded;
// none for byte-level checkpoints from before the token loader.
std::optional<data::Tokenizer> run_tokenizer(const GenerateArgs& a, const train::CheckpointRef& ck,
                                             const core::ModelSpec& spec) {
    const std::string where = ck.dir;
    const std::string name = ck.meta.value("tokenizer", "");
    if (name == "byte" && a.tokenizer.empty()) return std::nullopt;
    if (name.empty() && a.tokenizer.empty()) {
        throw IoError(
            fmt::format("{}: the run saved no tokenizer (it trained on data.sources "
                        "without data.tokenizer_file); pass --tokenizer FILE, the "
                        "shards' tokenizer.json",
                        where));
    }
    const std::string path =
        a.tokenizer.empty() ? (std::filesystem::path(a.run_dir) / name).string() : a.tokenizer;
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

void run(const GenerateArgs& a) {
    // CLI11's range check lets NaN through (every comparison with it is false).
    if (!std::isfinite(a.temperature) || a.temperature < 0) {
        throw ConfigError(
            fmt::format("--temperature = {}: give a number >= 0 (0: greedy)", a.temperature));
    }
    const train::CheckpointRef ckpt = train::latest_checkpoint(a.run_dir);
    const std::string where = ckpt.dir;
    const core::ModelSpec spec = train::spec_from_json(ckpt.meta.at("model"), where);
    const std::optional<data::Tokenizer> tok = run_tokenizer(a, ckpt, spec);
    if (a.prompt.empty()) throw ConfigError("--prompt is empty; give at least one character");
    if (a.tokens < 0) throw ConfigError(fmt::format("--tokens = {} must be >= 0", a.tokens));
    const int64_t T =
        std::min<int64_t>(spec.max_seq_len, ckpt.meta.value("seq_len", int64_t(spec.max_seq_len)));
    model::Transformer model(spec, 1, T);
    train::load_weights(ckpt, model);

    std::vector<int32_t> ids;
    if (tok) {
        for (uint32_t id : tok->encode(a.prompt)) ids.push_back(int32_t(id));
    } else {
        for (char ch : a.prompt) ids.push_back(int32_t(uint8_t(ch)));
    }
    std::fwrite(a.prompt.data(), 1, a.prompt.size(), stdout);
    std::vector<float> logits(size_t(spec.vocab_size));
    // Ids past the tokenizer's (a padded model.vocab_size) decode to nothing.
    const size_t V = tok ? tok->vocab_size() : 256;
    const core::Philox rng(a.seed, 0x67656e);
    for (int i = 0; i < a.tokens; ++i) {
        // The model sees at most the length it was trained on: the most
        // recent tokens.
        const int64_t n = std::min<int64_t>(int64_t(ids.size()), T);
        model.last_logits(logits.data(), ids.data() + ids.size() - n, n);
        logits.resize(std::min(V, size_t(spec.vocab_size)));
        const int next = sample(logits, a.temperature, a.top_k, rng, uint64_t(i));
        logits.resize(size_t(spec.vocab_size));
        ids.push_back(next);
        if (tok) {
            const std::string& bytes = tok->token_bytes(uint32_t(next));
            std::fwrite(bytes.data(), 1, bytes.size(), stdout);
        } else {
            const char ch = char(next);
            std::fwrite(&ch, 1, 1, stdout);
        }
        std::fflush(stdout);
    }
    std::fputc('\n', stdout);
}

void setup(CLI::App& app) {
    auto* cmd = app.add_subcommand("generate", "sample text from a trained run");
    static GenerateArgs a;
    cmd->add_option("--run", a.run_dir, "run directory (its latest checkpoint is used)")
        ->required();
    cmd->add_option("--prompt", a.prompt, "text to continue");
    cmd->add_option("--tokenizer", a.tokenizer,
                    "tokenizer.json to use instead of the run's (its hash must match)");
    cmd->add_option("--tokens", a.tokens, "tokens to generate")->capture_default_str();
    cmd->add_option("--temperature", a.temperature, "softmax temperature (0: greedy)")
        ->check(CLI::Range(0.0, 100.0))
        ->capture_default_str();
    cmd->add_option("--top-k", a.top_k, "sample among the k most likely tokens (0: all)")
        ->check(CLI::Range(0, 1 << 24))
        ->capture_default_str();
    cmd->add_option("--seed", a.seed, "sampling seed")->capture_default_str();
    cmd->callback([] { run(a); });
}

CommandRegistrar reg("generate", setup);

}  // namespace

}  // namespace apiary::cli
