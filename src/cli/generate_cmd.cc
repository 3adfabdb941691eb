// `apiary generate --run DIR --prompt TEXT`: samples from a run's latest
// checkpoint (train/generate.h) and prints the text as it is drawn.

#include <cstdio>

#include "cli/command.h"
#include "train/generate.h"

namespace apiary::cli {

namespace {

void setup(CLI::App& app) {
    auto* cmd = app.add_subcommand("generate", "sample text from a trained run");
    static train::GenerateOptions a;
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
    cmd->callback([] {
        train::generate(a, [](std::string_view bytes) {
            std::fwrite(bytes.data(), 1, bytes.size(), stdout);
            std::fflush(stdout);
        });
        std::fputc('\n', stdout);
    });
}

CommandRegistrar reg("generate", setup);

}  // namespace

}  // namespace apiary::cli
