// `apiary tokenizer train|encode|decode|convert|info`: byte-level BPE (data/tokenizer.h).

#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <iterator>

#include "cli/command.h"
#include "core/error.h"
#include "data/bpe_train.h"
#include "data/documents.h"
#include "data/file_io.h"
#include "data/tokenizer.h"

namespace apiary::cli {

namespace {

struct Options {
    std::vector<std::string> inputs;
    std::string out = "tokenizer.json";
    std::string tokenizer = "tokenizer.json";
    std::string gpt2_vocab, gpt2_merges;
    std::string jsonl_field = "text";
    std::string text;
    size_t vocab_size = 8192;
    int threads = 0;
    bool no_special = false;
};
Options opt;

data::Tokenizer load_tokenizer() {
    if (!opt.gpt2_vocab.empty() || !opt.gpt2_merges.empty()) {
        if (opt.gpt2_vocab.empty() || opt.gpt2_merges.empty()) {
            throw ConfigError("tokenizer: --gpt2-vocab and --gpt2-merges go together");
        }
        return data::Tokenizer::load_gpt2(opt.gpt2_vocab, opt.gpt2_merges);
    }
    return data::Tokenizer::load(opt.tokenizer);
}

std::string read_stdin() {
    return std::string(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
}

void add_source_options(CLI::App* cmd) {
    cmd->add_option("--tokenizer", opt.tokenizer, "tokenizer.json to use");
    cmd->add_option("--gpt2-vocab", opt.gpt2_vocab, "GPT-2 vocab.json / encoder.json instead");
    cmd->add_option("--gpt2-merges", opt.gpt2_merges, "GPT-2 merges.txt / vocab.bpe instead");
}

void train() {
    const auto t0 = std::chrono::steady_clock::now();
    data::DocumentOptions dopt;
    dopt.jsonl_field = opt.jsonl_field;
    size_t bytes = 0, words = 0;
    const data::Tokenizer tok = data::train_bpe_on_files(
        opt.inputs,
        {.vocab_size = opt.vocab_size, .specials = {"<|endoftext|>"}, .num_threads = opt.threads},
        dopt, &bytes, &words);
    const auto t1 = std::chrono::steady_clock::now();
    tok.save(opt.out);
    fmt::print("trained {} tokens ({} merges) on {:.1f} MB, {} distinct words in {:.2f}s -> {}\n",
               tok.vocab_size(), tok.merges().size(), bytes / 1e6, words,
               std::chrono::duration<double>(t1 - t0).count(), opt.out);
}

void setup(CLI::App& app) {
    auto* cmd = app.add_subcommand("tokenizer", "train and run byte-level BPE tokenizers");
    cmd->require_subcommand(1);

    auto* tr = cmd->add_subcommand("train", "train a byte-level BPE tokenizer.json");
    tr->add_option("--input", opt.inputs, "text, .jsonl or .zst files")->required();
    tr->add_option("--vocab-size", opt.vocab_size, "tokens including <|endoftext|>");
    tr->add_option("--out", opt.out, "output tokenizer.json");
    tr->add_option("--jsonl-field", opt.jsonl_field, "field of each JSONL line to use");
    tr->add_option("--threads", opt.threads, "threads (0: all cores)");
    tr->callback(train);

    auto* enc = cmd->add_subcommand("encode", "text (--text or stdin) to token ids, one line");
    add_source_options(enc);
    enc->add_option("--text", opt.text, "text to encode (default: stdin)");
    enc->add_flag("--no-special", opt.no_special, "treat special-token text as ordinary text");
    enc->callback([] {
        const auto tok = load_tokenizer();
        const std::string text = opt.text.empty() ? read_stdin() : opt.text;
        const auto ids = tok.encode(text, !opt.no_special);
        std::string line;
        for (size_t i = 0; i < ids.size(); ++i) {
            if (i) line += ' ';
            line += std::to_string(ids[i]);
        }
        fmt::print("{}\n", line);
    });

    auto* dec = cmd->add_subcommand("decode", "token ids (--text or stdin) to bytes on stdout");
    add_source_options(dec);
    dec->add_option("--text", opt.text, "ids separated by spaces (default: stdin)");
    dec->callback([] {
        const auto tok = load_tokenizer();
        const std::string text = opt.text.empty() ? read_stdin() : opt.text;
        std::vector<uint32_t> ids;
        size_t pos = 0;
        while (pos < text.size()) {
            while (pos < text.size() && std::isspace(static_cast<unsigned char>(text[pos]))) ++pos;
            if (pos >= text.size()) break;
            size_t used = 0;
            unsigned long v = 0;
            try {
                v = std::stoul(text.substr(pos, 12), &used);
            } catch (const std::exception&) {
                throw DataError(fmt::format("decode: not a token id at byte {} of the input", pos));
            }
            ids.push_back(static_cast<uint32_t>(v));
            pos += used;
        }
        const std::string out = tok.decode(ids);
        std::fwrite(out.data(), 1, out.size(), stdout);
    });

    auto* conv = cmd->add_subcommand("convert", "write any loadable tokenizer as tokenizer.json");
    add_source_options(conv);
    conv->add_option("--out", opt.out, "output tokenizer.json")->required();
    conv->callback([] {
        const auto tok = load_tokenizer();
        tok.save(opt.out);
        fmt::print("wrote {} ({} tokens, hash {})\n", opt.out, tok.vocab_size(),
                   data::hex64(tok.hash()));
    });

    auto* info = cmd->add_subcommand("info", "vocabulary size, merges, special tokens, hash");
    add_source_options(info);
    info->callback([] {
        const auto tok = load_tokenizer();
        fmt::print("vocab_size {}\nmerges {}\nhash {}\n", tok.vocab_size(), tok.merges().size(),
                   data::hex64(tok.hash()));
        for (const auto& [s, id] : tok.specials()) fmt::print("special {} {}\n", id, s);
    });
}

CommandRegistrar reg("tokenizer", setup);

}  // namespace

}  // namespace apiary::cli
