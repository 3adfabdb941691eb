#pragma once
// Sampling text from a run: its latest checkpoint, with temperature, top-k
// and a seed, encoding and decoding with the tokenizer saved in the run
// directory (runs from before the token loader used raw bytes).
// `apiary generate` parses the arguments and prints what this emits.

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "core/rng.h"

namespace apiary::train {

struct GenerateOptions {
    std::string run_dir;
    std::string tokenizer;  // overrides the run's tokenizer.json
    std::string prompt = "\n";
    int tokens = 300;
    double temperature = 0.8;  // 0: greedy
    int top_k = 40;            // 0: all tokens
    uint64_t seed = 1;
};

// Samples an index from logits (V) with temperature and top-k; temperature
// 0 is greedy. The draw is the index-th of rng's stream, so a seed gives
// the same text every time.
int sample_token(const std::vector<float>& logits, double temperature, int top_k,
                 const core::Philox& rng, uint64_t index);

// Continues o.prompt from the run's latest checkpoint: emit receives the
// prompt, then each sampled token's bytes as soon as it is drawn. Throws
// ConfigError for bad options, IoError / DataError for a run whose
// checkpoint or tokenizer does not fit.
void generate(const GenerateOptions& o, const std::function<void(std::string_view)>& emit);

}  // namespace apiary::train
