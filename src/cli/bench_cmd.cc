// `apiary bench <what>`: end-to-end benchmarks that print their figures, or
// one JSON object with --json. `bench train` times full optimizer steps of a
// preset on random tokens and reports MFU against the GEMM peak measured in
// the same process; given several precisions it alternates them and reports
// the speedup measured round by round.

#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "cli/bench_comm.h"
#include "cli/bench_common.h"
#include "cli/bench_data.h"
#include "cli/command.h"
#include "core/allocator.h"
#include "core/error.h"
#include "core/model_spec.h"
#include "core/profile.h"
#include "core/rng.h"
#include "core/threads.h"
#include "core/timing.h"
#include "kernels/kernels.h"
#include "model/model.h"
#include "parallel/engine.h"

namespace apiary::cli {

using core::median;

namespace {

struct BenchTrainArgs {
    std::string preset = "gpt2-124m";
    int batch = 4;
    int seq = 256;
    int steps = 5;
    int warmup = 2;
    int threads = 0;
    std::string precision = "fp32";
    bool json = false;
    bool profile = false;
};

// memcpy GB/s of 256 MiB, the median of 5 copies (one thread): the memory
// peak that the memory-bound parts (AdamW, norms) are held to.
double memcpy_peak_gb_per_s() {
    const size_t bytes = size_t(256) << 20;
    std::vector<char> a(bytes, 1), b(bytes, 0);
    std::vector<double> t;
    for (int rep = 0; rep < 5; ++rep) {
        const auto t0 = core::Clock::now();
        std::memcpy(b.data(), a.data(), bytes);
        t.push_back(core::seconds_since(t0));
    }
    return double(bytes) / median(t) / 1e9;
}

// One model in one precision, with its optimizer and what its steps measured.
struct PrecisionRun {
    std::string name;
    model::Precision precision;
    std::unique_ptr<parallel::Engine> engine;
    double peak = 0;  // GEMM FLOP/s of the precision the matmuls run in
    std::vector<double> times;
    double loss = 0;
    std::map<std::string, double> regions;  // profiled seconds, summed over timed steps
};

std::vector<std::string> split_commas(const std::string& s) {
    std::vector<std::string> out;
    size_t at = 0;
    while (at <= s.size()) {
        const size_t comma = std::min(s.find(',', at), s.size());
        out.push_back(s.substr(at, comma - at));
        at = comma + 1;
    }
    return out;
}

// The trainer's step (parallel::Engine::train_step) on rows of seq + 1 tokens.
double run_step(PrecisionRun& r, const std::vector<int32_t>& rows, int batch, int seq) {
    const auto t0 = core::Clock::now();
    r.loss = r.engine->train_step(rows.data(), batch, seq, 1e-4, false).loss();
    return core::seconds_since(t0);
}

nlohmann::json memory_json() {
    const auto mem = core::mem_stats();
    int64_t sum = 0;
    nlohmann::json cats;
    for (int c = 0; c < core::kNumMemCategories; ++c) {
        cats[core::category_name(core::MemCategory(c))] = mem.peak[c];
        sum += mem.peak[c];
    }
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    cats["sum_of_categories"] = sum;
    cats["allocator_total_peak"] = mem.total_peak;
    cats["process_rss_peak"] = int64_t(ru.ru_maxrss) * 1024;
    return cats;
}

void print_memory(const nlohmann::json& cats, const char* whose) {
    const auto mem = core::mem_stats();
    for (int c = 0; c < core::kNumMemCategories; ++c) {
        fmt::print("  peak {:<11} {:>9.1f} MiB\n", core::category_name(core::MemCategory(c)),
                   double(mem.peak[c]) / 1048576.0);
    }
    const double sum = cats["sum_of_categories"].get<double>();
    const double rss = cats["process_rss_peak"].get<double>();
    fmt::print("  categories  {:>9.1f} MiB; process RSS peak {:.1f} MiB ({:.2f}x){}\n",
               sum / 1048576.0, rss / 1048576.0, rss / sum, whose);
}

// With several precisions (--precision fp32,bf16) the models are built side
// by side and their steps alternate (fp32, bf16, fp32, bf16, ...), so each
// sees the same machine: the ratio of two precisions is measured per round,
// which a shared machine's drift does not bias.
void bench_train(const BenchTrainArgs& a) {
    core::set_num_threads(a.threads);
    const core::ModelSpec& spec = core::preset(a.preset);
    if (a.seq > spec.max_seq_len) {
        throw ConfigError(
            fmt::format("--seq {} exceeds {}'s max_seq_len {}", a.seq, a.preset, spec.max_seq_len));
    }
    std::vector<PrecisionRun> runs;
    for (const auto& name : split_commas(a.precision)) {
        PrecisionRun r;
        r.name = name;
        r.precision = model::parse_precision(name);
        parallel::EngineOptions o;
        o.precision = r.precision;
        r.engine = std::make_unique<parallel::Engine>(spec, parallel::one_rank_layout(spec),
                                                      nullptr, a.batch, a.seq, o);
        r.engine->init(1);
        runs.push_back(std::move(r));
    }
    const int64_t n = int64_t(a.batch) * a.seq;
    const std::vector<int32_t> rows = random_token_rows(a.batch, a.seq, spec.vocab_size, 0);
    // MFU is against the peak of the precision the matmuls run in, measured now.
    // Both GEMM peaks and memcpy are measured in every run, whatever the
    // precision, so that one run's figures can be held to all three.
    const double sgemm_peak = kernels::measure_gemm_peak_flops(1.0);
    const double bf16_peak = kernels::measure_gemm_bf16_peak_flops(1.0);
    const double memcpy_gbs = memcpy_peak_gb_per_s();
    for (auto& r : runs) r.peak = r.precision == model::Precision::bf16 ? bf16_peak : sgemm_peak;
    core::Profiler& prof = core::Profiler::get();
    for (int s = 0; s < a.warmup + a.steps; ++s) {
        for (auto& r : runs) {
            const bool timed = s >= a.warmup;
            prof.reset();
            prof.enable(a.profile && timed);
            const double dt = run_step(r, rows, a.batch, a.seq);
            prof.enable(false);
            if (timed) {
                r.times.push_back(dt);
                for (const auto& [region, sec] : prof.totals()) r.regions[region] += sec;
            }
            if (!a.json) {
                fmt::print("  step {} {:<4} {:.3f} s loss {:.4f}{}\n", s, r.name, dt, r.loss,
                           timed ? "" : " (warm-up)");
            }
        }
    }
    // Checked output: on random tokens the loss stays near ln(V) (a model
    // that learns nothing from noise); far from it the step is broken.
    for (const auto& r : runs) {
        const double lnv = std::log(double(spec.vocab_size));
        APIARY_CHECK(std::isfinite(r.loss) && std::fabs(r.loss - lnv) < 0.5 * lnv,
                     "benchmark {} loss {} is far from ln(V) = {}: the step is broken", r.name,
                     r.loss, lnv);
    }
    const nlohmann::json cats = memory_json();
    const double rss = cats["process_rss_peak"].get<double>();
    const double sum = cats["sum_of_categories"].get<double>();
    std::vector<nlohmann::json> outs;
    for (const auto& r : runs) {
        const double step_s = median(r.times);
        const double tps = double(n) / step_s;
        const double flops = tps * spec.train_flops_per_token(a.seq);
        outs.push_back({{"preset", a.preset},
                        {"precision", r.name},
                        {"batch", a.batch},
                        {"seq", a.seq},
                        {"threads", core::num_threads()},
                        {"steps", a.steps},
                        {"step_time_s", step_s},
                        {"step_time_min_s", *std::min_element(r.times.begin(), r.times.end())},
                        {"step_time_max_s", *std::max_element(r.times.begin(), r.times.end())},
                        {"tokens_per_s", tps},
                        {"model_flops_per_s", flops},
                        {"matmul_peak_flops_per_s", r.peak},
                        {"mfu", flops / r.peak},
                        {"sgemm_peak_flops_per_s", sgemm_peak},
                        {"bf16_gemm_peak_flops_per_s", bf16_peak},
                        {"mfu_vs_sgemm_peak", flops / sgemm_peak},
                        {"memcpy_gb_per_s", memcpy_gbs},
                        {"cpu", cpu_model_name()},
                        {"peak_bytes", cats},
                        {"rss_over_categories", rss / sum},
                        {"final_loss", r.loss}});
    }
    // Speedup of each later precision over the first, per round and overall.
    nlohmann::json speedups = nlohmann::json::object();
    for (size_t i = 1; i < runs.size(); ++i) {
        std::vector<double> per_round;
        for (int s = 0; s < a.steps; ++s) per_round.push_back(runs[0].times[s] / runs[i].times[s]);
        speedups[runs[i].name + "/" + runs[0].name] = {
            {"median_of_rounds", median(per_round)},
            {"min", *std::min_element(per_round.begin(), per_round.end())},
            {"max", *std::max_element(per_round.begin(), per_round.end())},
            {"of_medians", median(runs[0].times) / median(runs[i].times)}};
    }
    if (a.json) {
        if (runs.size() == 1) {
            fmt::print("{}\n", outs[0].dump());
        } else {
            fmt::print("{}\n", nlohmann::json{{"runs", outs}, {"speedup", speedups}}.dump());
        }
        return;
    }
    for (size_t i = 0; i < runs.size(); ++i) {
        const auto& r = runs[i];
        const auto& o = outs[i];
        fmt::print("bench train {} {} B={} T={} threads={}\n", a.preset, r.name, a.batch, a.seq,
                   core::num_threads());
        fmt::print("  step time   {:.3f} s (median of {}; min {:.3f}, max {:.3f})\n",
                   o["step_time_s"].get<double>(), a.steps, o["step_time_min_s"].get<double>(),
                   o["step_time_max_s"].get<double>());
        fmt::print("  tokens/s    {:.1f}\n", o["tokens_per_s"].get<double>());
        fmt::print("  model FLOPs {:.1f} GFLOP/s (6N + attention per token)\n",
                   o["model_flops_per_s"].get<double>() / 1e9);
        fmt::print("  GEMM peak   {:.1f} GFLOP/s (oneDNN {} matmul, measured now)\n", r.peak / 1e9,
                   r.precision == model::Precision::bf16 ? "bf16" : "fp32");
        fmt::print("  MFU         {:.1f}%\n", 100 * o["mfu"].get<double>());
        fmt::print(
            "  peaks       sgemm {:.1f}, bf16 GEMM {:.1f} GFLOP/s, memcpy {:.1f} GB/s ({})\n",
            sgemm_peak / 1e9, bf16_peak / 1e9, memcpy_gbs, cpu_model_name());
        if (a.profile) {
            double total = 0;
            for (double t : r.times) total += t;
            std::vector<std::pair<std::string, double>> regions(r.regions.begin(), r.regions.end());
            std::sort(regions.begin(), regions.end(),
                      [](const auto& x, const auto& y) { return x.second > y.second; });
            fmt::print(
                "  time per step by region (mean over timed steps; nested regions "
                "counted twice):\n");
            double covered = 0;
            for (const auto& [name, sec] : regions) {
                if (name.find(':') == std::string::npos) covered += sec;  // "head: ..." nests
                fmt::print("    {:<26} {:>7.3f} s {:>5.1f}%\n", name, sec / a.steps,
                           100 * sec / total);
            }
            fmt::print("    {:<26} {:>7.3f} s {:>5.1f}%\n", "other (norms, activations)",
                       (total - covered) / a.steps, 100 * (total - covered) / total);
        }
    }
    print_memory(cats, runs.size() > 1 ? " (all models together)" : "");
    for (const auto& [pair, sp] : speedups.items()) {
        fmt::print(
            "speedup {}: {:.2f}x median of {} same-round ratios (min {:.2f}, max {:.2f}); "
            "{:.2f}x of the medians\n",
            pair, sp["median_of_rounds"].get<double>(), a.steps, sp["min"].get<double>(),
            sp["max"].get<double>(), sp["of_medians"].get<double>());
    }
}

void setup(CLI::App& app) {
    auto* cmd = app.add_subcommand("bench", "benchmarks: train (and more with other layers)");
    cmd->require_subcommand(1);
    auto* tr = cmd->add_subcommand("train", "time optimizer steps of a model preset");
    static BenchTrainArgs a;
    tr->add_option("--preset", a.preset, "model preset")->capture_default_str();
    tr->add_option("--batch", a.batch, "micro-batch B")
        ->check(CLI::Range(1, 1 << 16))
        ->capture_default_str();
    tr->add_option("--seq", a.seq, "sequence length T")
        ->check(CLI::Range(1, 1 << 20))
        ->capture_default_str();
    tr->add_option("--steps", a.steps, "timed steps")
        ->check(CLI::Range(1, 1 << 20))
        ->capture_default_str();
    tr->add_option("--warmup", a.warmup, "untimed steps first")
        ->check(CLI::Range(0, 1 << 20))
        ->capture_default_str();
    tr->add_option("--threads", a.threads, "threads (0: all cores)")->capture_default_str();
    tr->add_option("--precision", a.precision,
                   "fp32, bf16 or fp16 (emulated), or a comma list (fp32,bf16): the models' "
                   "steps then alternate and the speedup over the first is reported")
        ->check([](const std::string& v) {
            for (const auto& p : split_commas(v)) {
                if (p != "fp32" && p != "bf16" && p != "fp16") {
                    return fmt::format("unknown precision '{}' (known: fp32, bf16, fp16)", p);
                }
            }
            return std::string();
        })
        ->capture_default_str();
    tr->add_flag("--json", a.json, "print one JSON object");
    tr->add_flag("--profile", a.profile, "also print where a step's time goes");
    tr->callback([] { bench_train(a); });
    add_bench_comm_command(cmd);
    add_bench_ddp_command(cmd);
    add_bench_ckpt_command(cmd);
    add_bench_obs_command(cmd);
    add_bench_data_commands(cmd);
}

CommandRegistrar reg("bench", setup);

}  // namespace

}  // namespace apiary::cli
