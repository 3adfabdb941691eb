// `apiary generate --run DIR --prompt TEXT`: samples from a run's latest
// checkpoint with temperature, top-k and a seed.

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "cli/command.h"
#include "core/error.h"
#include "core/rng.h"
#include "model/model.h"
#include "train/checkpoint.h"

namespace apiary::cli {

namespace {

struct GenerateArgs {
    std::string run_dir;
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
    if (temperature <= 0) return int(std::max_element(logits.begin(), logits.end()) - logits.begin());
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

void run(const GenerateArgs& a) {
    const train::CheckpointRef ckpt = train::latest_checkpoint(a.run_dir);
    const std::string where = ckpt.dir + "/meta.json";
    const core::ModelSpec spec = train::spec_from_json(ckpt.meta.at("model"), where);
    const std::string tokenizer = ckpt.meta.value("tokenizer", "");
    if (tokenizer != "byte") {
        throw IoError(fmt::format("{}: tokenizer '{}' is not supported by this build (byte only)",
                                  where, tokenizer));
    }
    if (a.prompt.empty()) throw ConfigError("--prompt is empty; give at least one character");
    if (a.tokens < 0) throw ConfigError(fmt::format("--tokens = {} must be >= 0", a.tokens));
    const int64_t T = std::min<int64_t>(spec.max_seq_len,
                                        ckpt.meta.value("seq_len", int64_t(spec.max_seq_len)));
    model::Transformer model(spec, 1, T);
    train::load_weights(ckpt, model);

    std::vector<int32_t> ids(a.prompt.begin(), a.prompt.end());
    for (auto& id : ids) id = int32_t(uint8_t(id));
    std::fwrite(a.prompt.data(), 1, a.prompt.size(), stdout);
    std::vector<float> logits(size_t(spec.vocab_size));
    const core::Philox rng(a.seed, 0x67656e);
    for (int i = 0; i < a.tokens; ++i) {
        // The model sees at most the length it was trained on: the most
        // recent tokens.
        const int64_t n = std::min<int64_t>(int64_t(ids.size()), T);
        model.last_logits(logits.data(), ids.data() + ids.size() - n, n);
        const int next = sample(logits, a.temperature, a.top_k, rng, uint64_t(i));
        ids.push_back(next);
        const char ch = char(next);
        std::fwrite(&ch, 1, 1, stdout);
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
