// `apiary bench <what>`: end-to-end benchmarks that print their figures, or
// one JSON object with --json. `bench train` times full optimizer steps of a
// preset on random tokens and reports MFU against the GEMM peak measured in
// the same process.

#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <vector>

#include "cli/bench_comm.h"
#include "cli/bench_data.h"
#include "cli/command.h"
#include "core/allocator.h"
#include "core/error.h"
#include "core/model_spec.h"
#include "core/profile.h"
#include "core/rng.h"
#include "core/threads.h"
#include "kernels/kernels.h"
#include "model/model.h"
#include "optim/adamw.h"

namespace apiary::cli {

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

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void bench_train(const BenchTrainArgs& a) {
    core::set_num_threads(a.threads);
    const core::ModelSpec& spec = core::preset(a.preset);
    if (a.seq > spec.max_seq_len) {
        throw ConfigError(fmt::format("--seq {} exceeds {}'s max_seq_len {}", a.seq, a.preset,
                                      spec.max_seq_len));
    }
    const model::Precision precision = model::parse_precision(a.precision);
    model::Transformer m(spec, a.batch, a.seq, precision);
    m.init(1);
    std::vector<optim::ParamRange> ranges;
    for (const auto& e : m.registry().entries()) ranges.push_back({e.offset, e.numel(), e.decay});
    optim::AdamW adam(ranges, m.flat_size(), {});
    const int64_t n = int64_t(a.batch) * a.seq;
    std::vector<int32_t> tokens(static_cast<size_t>(n)), targets(static_cast<size_t>(n));
    const core::Philox rng(7, 0);
    for (int64_t i = 0; i < n; ++i) {
        tokens[i] = int32_t(rng.below(2 * uint64_t(i), spec.vocab_size));
        targets[i] = int32_t(rng.below(2 * uint64_t(i) + 1, spec.vocab_size));
    }
    // MFU is against the peak of the precision the matmuls run in, measured now.
    const double peak = precision == model::Precision::bf16
                            ? kernels::measure_gemm_bf16_peak_flops(1.0)
                            : kernels::measure_gemm_peak_flops(1.0);
    std::vector<double> times;
    double loss = 0;
    core::Profiler& prof = core::Profiler::get();
    for (int s = 0; s < a.warmup + a.steps; ++s) {
        prof.enable(a.profile && s >= a.warmup);
        const auto t0 = std::chrono::steady_clock::now();
        m.zero_grads();
        loss = m.forward_backward(tokens.data(), targets.data(), a.batch, a.seq, 1.0f / float(n))
                   .mean();
        adam.step(m.params(), m.grads(), 1e-4f);
        const double dt =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (s >= a.warmup) times.push_back(dt);
        if (!a.json) {
            fmt::print("  step {} {:.3f} s loss {:.4f}{}\n", s, dt, loss,
                       s < a.warmup ? " (warm-up)" : "");
        }
    }
    // Checked output: a random-token loss starts near ln(V).
    APIARY_CHECK(std::isfinite(loss), "benchmark produced a non-finite loss {}", loss);
    const double step_s = median(times);
    const double tps = double(n) / step_s;
    const double flops = tps * spec.train_flops_per_token(a.seq);
    const auto mem = core::mem_stats();
    int64_t sum = 0;
    nlohmann::json cats;
    for (int c = 0; c < core::kNumMemCategories; ++c) {
        cats[core::category_name(core::MemCategory(c))] = mem.peak[c];
        sum += mem.peak[c];
    }
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    const int64_t rss = int64_t(ru.ru_maxrss) * 1024;
    cats["sum_of_categories"] = sum;
    cats["allocator_total_peak"] = mem.total_peak;
    cats["process_rss_peak"] = rss;
    const nlohmann::json out = {
        {"preset", a.preset}, {"precision", a.precision}, {"batch", a.batch}, {"seq", a.seq}, {"threads", core::num_threads()},
        {"steps", a.steps}, {"step_time_s", step_s},
        {"step_time_min_s", *std::min_element(times.begin(), times.end())},
        {"step_time_max_s", *std::max_element(times.begin(), times.end())},
        {"tokens_per_s", tps}, {"model_flops_per_s", flops},
        {"matmul_peak_flops_per_s", peak}, {"mfu", flops / peak}, {"peak_bytes", cats},
        {"rss_over_categories", double(rss) / double(sum)}, {"final_loss", loss}};
    if (a.json) {
        fmt::print("{}\n", out.dump());
        return;
    }
    fmt::print("bench train {} {} B={} T={} threads={}\n", a.preset, a.precision, a.batch, a.seq,
               core::num_threads());
    fmt::print("  step time   {:.3f} s (median of {}; min {:.3f}, max {:.3f})\n", step_s, a.steps,
               out["step_time_min_s"].get<double>(), out["step_time_max_s"].get<double>());
    fmt::print("  tokens/s    {:.1f}\n", tps);
    fmt::print("  model FLOPs {:.1f} GFLOP/s (6N + attention per token)\n", flops / 1e9);
    fmt::print("  GEMM peak   {:.1f} GFLOP/s (oneDNN {} matmul, measured now)\n", peak / 1e9,
               precision == model::Precision::bf16 ? "bf16" : "fp32");
    fmt::print("  MFU         {:.1f}%\n", 100 * flops / peak);
    for (int c = 0; c < core::kNumMemCategories; ++c) {
        fmt::print("  peak {:<11} {:>9.1f} MiB\n", core::category_name(core::MemCategory(c)),
                   double(mem.peak[c]) / 1048576.0);
    }
    fmt::print("  categories  {:>9.1f} MiB; process RSS peak {:.1f} MiB ({:.2f}x)\n",
               double(sum) / 1048576.0, double(rss) / 1048576.0, double(rss) / double(sum));
    if (a.profile) {
        double total = 0;
        for (double t : times) total += t;
        fmt::print("  time per step by region (mean over timed steps):\n");
        double covered = 0;
        for (const auto& [name, sec] : prof.totals()) {
            covered += sec;
            fmt::print("    {:<26} {:>7.3f} s {:>5.1f}%\n", name, sec / a.steps, 100 * sec / total);
        }
        fmt::print("    {:<26} {:>7.3f} s {:>5.1f}%\n", "other (norms, activations)",
                   (total - covered) / a.steps, 100 * (total - covered) / total);
    }
}

void setup(CLI::App& app) {
    auto* cmd = app.add_subcommand("bench", "benchmarks: train (and more with other layers)");
    cmd->require_subcommand(1);
    auto* tr = cmd->add_subcommand("train", "time optimizer steps of a model preset");
    static BenchTrainArgs a;
    tr->add_option("--preset", a.preset, "model preset")->capture_default_str();
    tr->add_option("--batch", a.batch, "micro-batch B")->check(CLI::Range(1, 1 << 16))->capture_default_str();
    tr->add_option("--seq", a.seq, "sequence length T")->check(CLI::Range(1, 1 << 20))->capture_default_str();
    tr->add_option("--steps", a.steps, "timed steps")->check(CLI::Range(1, 1 << 20))->capture_default_str();
    tr->add_option("--warmup", a.warmup, "untimed steps first")->check(CLI::Range(0, 1 << 20))->capture_default_str();
    tr->add_option("--threads", a.threads, "threads (0: all cores)")->capture_default_str();
    tr->add_option("--precision", a.precision, "fp32, bf16 or fp16 (emulated)")
        ->check(CLI::IsMember({"fp32", "bf16", "fp16"}))
        ->capture_default_str();
    tr->add_flag("--json", a.json, "print one JSON object");
    tr->add_flag("--profile", a.profile, "also print where a step's time goes");
    tr->callback([] { bench_train(a); });
    add_bench_comm_command(cmd);
    add_bench_ddp_command(cmd);
    add_bench_data_commands(cmd);
}

CommandRegistrar reg("bench", setup);

}  // namespace

}  // namespace apiary::cli
