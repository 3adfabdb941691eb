// `apiary bench ddp`: data-parallel training steps of a preset on random
// tokens, run under mpirun (or alone for the one-rank baseline) with a fixed
// global batch. Reports per-step time, tokens/s, the seconds each step waited
// for gradient communication after backward (exposed), and the seconds the
// same reductions take with nothing to overlap (measured in the same run,
// after the timed steps): hidden = 1 - exposed / alone.
// bench/ddp_scaling.sh runs it on 1 and 2 ranks and derives the scaling
// efficiency.

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <vector>

#include "cli/bench_comm.h"
#include "cli/command.h"
#include "comm/config.h"
#include "comm/mpi_backend.h"
#include "core/error.h"
#include "core/model_spec.h"
#include "core/rng.h"
#include "core/threads.h"
#include "model/model.h"
#include "optim/adamw.h"
#include "parallel/data_parallel.h"

#include <CLI/CLI.hpp>

namespace apiary::cli {

namespace {

using Clock = std::chrono::steady_clock;

struct DdpArgs {
    std::string preset = "gpt2-124m";
    int global_batch = 8;
    int seq = 128;
    int steps = 4;
    int warmup = 1;
    int threads = 1;
    int zero_stage = 0;
    double bucket_mb = 25.0;
    bool json = false;
};

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

void bench_ddp(const DdpArgs& a) {
    if (a.zero_stage < 0 || a.zero_stage > 1) {
        throw ConfigError(fmt::format("--zero-stage {}: the overlap figure is for stages 0 and 1 "
                                      "(stages 2-3 reduce inside backward on every micro-step)",
                                      a.zero_stage));
    }
    std::unique_ptr<comm::MpiSession> mpi;
    comm::ProcessGroup* world = nullptr;
    if (comm::launched_by_mpi()) {
        comm::CommOptions o;
        o.bucket_mb = a.bucket_mb;
        mpi = std::make_unique<comm::MpiSession>(o);
        world = mpi->world().get();
        set_abort_hook([](int code) { comm::abort_mpi(code); });
    }
    const int n = world ? world->size() : 1, rank = world ? world->rank() : 0;
    if (a.global_batch % n != 0) {
        throw ConfigError(fmt::format("--global-batch {} does not split over {} ranks",
                                      a.global_batch, n));
    }
    const int B = a.global_batch / n;
    core::set_num_threads(a.threads);
    const core::ModelSpec& spec = core::preset(a.preset);
    if (a.seq > spec.max_seq_len) {
        throw ConfigError(fmt::format("--seq {} exceeds {}'s max_seq_len {}", a.seq, a.preset,
                                      spec.max_seq_len));
    }
    model::Transformer m(spec, B, a.seq, model::Precision::fp32,
                         parallel::DataParallel::shard_multiple(n));
    m.init(1);
    std::unique_ptr<parallel::DataParallel> dp;
    if (n > 1) dp = std::make_unique<parallel::DataParallel>(*world, m, a.bucket_mb, a.zero_stage);
    std::vector<optim::ParamRange> ranges;
    for (const auto& e : m.registry().entries()) ranges.push_back({e.offset, e.numel(), e.decay});
    optim::AdamW adam(dp ? dp->optimizer_ranges() : ranges,
                      dp ? dp->optimizer_size() : m.flat_size(), {});
    // This rank's rows of the global batch.
    const int64_t tokens_per_rank = int64_t(B) * a.seq;
    std::vector<int32_t> tokens(static_cast<size_t>(tokens_per_rank)),
        targets(static_cast<size_t>(tokens_per_rank));
    const core::Philox rng(7, uint64_t(rank));
    for (int64_t i = 0; i < tokens_per_rank; ++i) {
        tokens[size_t(i)] = int32_t(rng.below(2 * uint64_t(i), spec.vocab_size));
        targets[size_t(i)] = int32_t(rng.below(2 * uint64_t(i) + 1, spec.vocab_size));
    }
    std::vector<double> step_s, exposed_s, alone_s;
    for (int s = 0; s < a.warmup + a.steps; ++s) {
        if (world) world->barrier({"bench_step", s})->wait();
        const auto t0 = Clock::now();
        if (dp) {
            dp->zero_grads();
            dp->begin_micro_step(true);
        } else {
            m.zero_grads();
        }
        m.forward_backward(tokens.data(), targets.data(), B, a.seq,
                           1.0f / float(tokens_per_rank * n));
        if (dp) dp->finish_gradients();
        const double norm = dp ? dp->grad_norm(adam) : adam.grad_norm(m.grads());
        adam.step(dp ? dp->optimizer_params() : m.params(), dp ? dp->optimizer_grads() : m.grads(),
                  1e-4f, 1.0f, norm);
        if (dp) dp->gather_parameters();
        const double dt = since(t0);
        if (s < a.warmup) continue;
        step_s.push_back(dt);
        exposed_s.push_back(dp ? dp->exposed_seconds() : 0.0);
    }
    // The same reductions with nothing to hide behind: every bucket is
    // started at once and waited for.
    for (int s = 0; dp && s < a.steps; ++s) {
        world->barrier({"bench_alone", s})->wait();
        const auto t0 = Clock::now();
        dp->begin_micro_step(true);
        dp->finish_gradients();
        alone_s.push_back(since(t0));
    }
    if (rank != 0) return;
    const double step = median(step_s), exposed = median(exposed_s);
    const double alone = alone_s.empty() ? 0.0 : median(alone_s);
    const double hidden = alone > 0 ? std::clamp(1.0 - exposed / alone, 0.0, 1.0) : 1.0;
    const double tps = double(a.global_batch) * a.seq / step;
    const nlohmann::json out = {{"preset", a.preset},
                                {"ranks", n},
                                {"threads_per_rank", core::num_threads()},
                                {"global_batch", a.global_batch},
                                {"seq", a.seq},
                                {"zero_stage", a.zero_stage},
                                {"bucket_mb", a.bucket_mb},
                                {"buckets", dp ? dp->num_buckets() : 0},
                                {"gradient_bytes", m.flat_size() * 4},
                                {"step_time_s", step},
                                {"tokens_per_s", tps},
                                {"comm_exposed_s", exposed},
                                {"comm_alone_s", alone},
                                {"comm_hidden_fraction", hidden}};
    if (a.json) {
        fmt::print("{}\n", out.dump());
        return;
    }
    fmt::print("bench ddp: {} on {} rank(s) x {} thread(s), global batch {} x {} tokens\n",
               a.preset, n, core::num_threads(), a.global_batch, a.seq);
    fmt::print("  step {:.3f} s, {:.0f} tok/s\n", step, tps);
    if (dp) {
        fmt::print("  {} buckets of {} MiB over {:.1f} MB of gradients: {:.3f} s alone, {:.3f} s "
                   "exposed after backward -> {:.0f}% hidden\n",
                   dp->num_buckets(), a.bucket_mb, double(m.flat_size()) * 4 / 1e6, alone,
                   exposed, 100 * hidden);
    }
}

}  // namespace

void add_bench_ddp_command(CLI::App* bench) {
    auto* cmd = bench->add_subcommand(
        "ddp",
        "data-parallel steps on a fixed global batch: step time, communication alone and "
        "exposed; run under mpirun (alone for the one-rank baseline)");
    static DdpArgs a;
    cmd->add_option("--preset", a.preset, "model preset")->capture_default_str();
    cmd->add_option("--global-batch", a.global_batch, "sequences per step over all ranks")
        ->check(CLI::Range(1, 4096))
        ->capture_default_str();
    cmd->add_option("--seq", a.seq, "sequence length")->check(CLI::Range(1, 1 << 20))
        ->capture_default_str();
    cmd->add_option("--steps", a.steps, "timed steps (median reported)")
        ->check(CLI::Range(1, 1000))
        ->capture_default_str();
    cmd->add_option("--warmup", a.warmup, "untimed steps first")->check(CLI::Range(0, 100))
        ->capture_default_str();
    cmd->add_option("--threads", a.threads, "threads per rank (0: all cores)")
        ->check(CLI::Range(0, 4096))
        ->capture_default_str();
    cmd->add_option("--zero-stage", a.zero_stage, "0 (all-reduce) or 1 (reduce-scatter)")
        ->capture_default_str();
    cmd->add_option("--bucket-mb", a.bucket_mb, "gradient bucket size in MiB")
        ->check(CLI::Range(0.001, 1e5))
        ->capture_default_str();
    cmd->add_flag("--json", a.json, "one JSON object");
    cmd->callback([] { bench_ddp(a); });
}

}  // namespace apiary::cli
