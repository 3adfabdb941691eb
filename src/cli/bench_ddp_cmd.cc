// `apiary bench parallel` (and its older name `bench ddp`): training steps of
// a preset on random tokens under any dp x tp x pp layout, run under mpirun
// (or alone for the one-rank baseline) with a fixed global batch. Reports per
// step: time, tokens/s, where the time went (compute, tensor-parallel
// communication, pipeline waits and bubble, data-parallel communication not
// hidden behind backward), bytes communicated, and per-rank peak memory by
// category; for data parallelism also the seconds the same reductions take
// with nothing to overlap (measured after the timed steps): hidden = 1 -
// exposed / alone. bench/ddp_scaling.sh and bench/parallel_layouts.sh run it.

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <vector>

#include "cli/bench_comm.h"
#include "cli/bench_common.h"
#include "cli/command.h"
#include "comm/config.h"
#include "core/allocator.h"
#include "core/config.h"
#include "core/error.h"
#include "core/model_spec.h"
#include "core/rng.h"
#include "core/threads.h"
#include "core/timing.h"
#include "parallel/engine.h"
#include "parallel/layout.h"

namespace apiary::cli {

namespace {

using core::Clock;
using core::median;
using core::seconds_since;

struct ParallelArgs {
    std::string preset = "gpt2-124m";
    int global_batch = 8;
    int seq = 128;
    int steps = 4;
    int warmup = 1;
    int threads = 1;
    int zero_stage = 0;
    int tp = 1, pp = 1, microbatches = 1, virtual_stages = 2;
    std::string schedule = "1f1b", recompute = "none", precision = "fp32";
    bool sequence_parallel = false;
    double bucket_mb = 25.0;
    bool json = false;
};

// The layout as the trainer would build it from the same keys.
parallel::ParallelLayout layout_of(const ParallelArgs& a, const core::ModelSpec& spec, int n,
                                   int B) {
    core::Config c(full_schema());
    auto set = [&](const std::string& kv) { c.set(kv); };
    set(fmt::format("parallel.tp={}", a.tp));
    set(fmt::format("parallel.pp={}", a.pp));
    set(fmt::format("parallel.zero_stage={}", a.zero_stage));
    set("parallel.schedule=" + a.schedule);
    set(fmt::format("parallel.virtual_stages={}", a.virtual_stages));
    set("parallel.recompute=" + a.recompute);
    set(fmt::format("parallel.sequence_parallel={}", a.sequence_parallel));
    set(fmt::format("train.grad_accum={}", a.microbatches));
    set(fmt::format("train.batch_size={}", B));
    set(fmt::format("train.seq_len={}", a.seq));
    return parallel::parallel_layout_from(c, spec, n);
}

nlohmann::json peak_memory() {
    const auto mem = core::mem_stats();
    nlohmann::json j;
    for (int k = 0; k < core::kNumMemCategories; ++k) {
        j[core::category_name(core::MemCategory(k))] = mem.peak[k];
    }
    j["total"] = mem.total_peak;
    return j;
}

void bench_parallel(const ParallelArgs& a) {
    comm::CommOptions co;
    co.bucket_mb = a.bucket_mb;
    const MpiWorld mpi = start_mpi_world(co);
    comm::ProcessGroup* world = mpi.world;
    const int n = world ? world->size() : 1;
    core::set_num_threads(a.threads);
    const core::ModelSpec& spec = core::preset(a.preset);
    if (a.seq > spec.max_seq_len) {
        throw ConfigError(
            fmt::format("--seq {} exceeds {}'s max_seq_len {}", a.seq, a.preset, spec.max_seq_len));
    }
    const int dp = n / (a.tp * a.pp);
    if (dp < 1 || a.global_batch % (dp * a.microbatches) != 0) {
        throw ConfigError(
            fmt::format("--global-batch {} does not split over dp {} x {} "
                        "micro-batches",
                        a.global_batch, dp, a.microbatches));
    }
    const int B = a.global_batch / (dp * a.microbatches);
    const parallel::ParallelLayout layout = layout_of(a, spec, n, B);
    parallel::EngineOptions o;
    o.precision = model::parse_precision(a.precision);
    o.bucket_mb = a.bucket_mb;
    parallel::Engine engine(spec, layout, world, B, a.seq, o);
    engine.init(1);
    // This data-parallel rank's rows: random tokens, the same on the tensor-
    // and pipeline-parallel ranks that share them.
    const std::vector<int32_t> rows = random_token_rows(
        int64_t(B) * a.microbatches, a.seq, spec.vocab_size, uint64_t(engine.coord().dp));
    std::vector<double> step_s, exposed_s, tp_s, pp_s, compute_s, bubble;
    double loss = 0;
    for (int s = 0; s < a.warmup + a.steps; ++s) {
        if (world) world->barrier({"bench_step", s})->wait();
        const auto t0 = Clock::now();
        loss =
            engine.train_step(rows.data(), int64_t(rows.size()) / (a.seq + 1), a.seq, 1e-4, false)
                .loss();
        const double dt = seconds_since(t0);
        if (s < a.warmup) continue;
        const auto& t = engine.times();
        step_s.push_back(dt);
        exposed_s.push_back(t.dp_exposed);
        tp_s.push_back(t.tp_comm);
        pp_s.push_back(t.pp_wait);
        compute_s.push_back(t.compute);
        bubble.push_back(t.bubble());
    }
    // The same reductions with nothing to hide behind.
    std::vector<double> alone_s;
    for (int s = 0; layout.dp() > 1 && s < a.steps; ++s) {
        world->barrier({"bench_alone", s})->wait();
        alone_s.push_back(engine.reduction_alone_seconds());
    }
    const double alone = alone_s.empty() ? 0.0 : median(alone_s);
    const double hidden = alone > 0 ? std::clamp(1.0 - median(exposed_s) / alone, 0.0, 1.0) : 1.0;
    // Checked output: on random tokens the loss stays near ln(V).
    const double lnv = std::log(double(spec.vocab_size));
    APIARY_CHECK(std::isfinite(loss) && std::fabs(loss - lnv) < 0.5 * lnv,
                 "benchmark loss {} is far from ln(V) = {}: the step is broken", loss, lnv);
    const nlohmann::json mem = peak_memory();
    nlohmann::json rank = {{"world_rank", engine.world_rank()},
                           {"dp", engine.coord().dp},
                           {"tp", engine.coord().tp},
                           {"pp", engine.coord().pp},
                           {"step_time_s", median(step_s)},
                           {"compute_s", median(compute_s)},
                           {"tp_comm_s", median(tp_s)},
                           {"pp_wait_s", median(pp_s)},
                           {"bubble", median(bubble)},
                           {"dp_exposed_s", median(exposed_s)},
                           {"forward_op_s", engine.times().forward_op},
                           {"backward_op_s", engine.times().backward_op},
                           {"tp_bytes", engine.tp_bytes()},
                           {"pp_bytes", engine.pp_bytes()},
                           {"flat_floats", engine.model().flat_size()},
                           {"peak_bytes", mem}};
    // Every rank's figures to the first (one JSON string each).
    std::vector<nlohmann::json> ranks = {rank};
    if (world) {
        ranks.clear();
        for (const auto& text : comm::all_gather_strings(*world, rank.dump())) {
            ranks.push_back(nlohmann::json::parse(text));
        }
    }
    if (!engine.main_rank()) return;
    const double step = median(step_s);
    const double tps = double(a.global_batch) * a.seq / step;
    double bubble_max = 0;
    for (const auto& r : ranks) bubble_max = std::max(bubble_max, r["bubble"].get<double>());
    // The schedule replayed with each stage's measured op times: the bubble
    // the per-stage timings imply, free of this machine's scheduling noise.
    std::vector<double> fwd(size_t(layout.pp()), 0.0), bwd(size_t(layout.pp()), 0.0);
    std::vector<int> count(size_t(layout.pp()), 0);
    for (const auto& r : ranks) {
        const size_t st = size_t(r["pp"].get<int>());
        fwd[st] += r["forward_op_s"].get<double>();
        bwd[st] += r["backward_op_s"].get<double>();
        count[st] += 1;
    }
    for (size_t st = 0; st < fwd.size(); ++st) {
        fwd[st] /= count[st];
        bwd[st] /= count[st];
    }
    const auto replay = parallel::replay_idle(
        layout.pp() > 1 ? layout.schedule : parallel::PipelineSchedule::one_f_one_b, layout.pp(),
        layout.microbatches, layout.virtual_stages, fwd, bwd);
    const nlohmann::json out = {
        {"preset", a.preset},
        {"ranks", n},
        {"layout", layout.describe()},
        {"threads_per_rank", core::num_threads()},
        {"global_batch", a.global_batch},
        {"seq", a.seq},
        {"precision", a.precision},
        {"step_time_s", step},
        {"tokens_per_s", tps},
        {"ideal_bubble",
         parallel::ideal_bubble(layout.pp(), layout.microbatches, layout.virtual_stages)},
        {"bubble_max", bubble_max},
        {"replayed_bubble_max", *std::max_element(replay.begin(), replay.end())},
        {"zero_stage", layout.zero_stage},
        {"bucket_mb", a.bucket_mb},
        {"buckets", engine.num_buckets()},
        {"comm_exposed_s", median(exposed_s)},
        {"comm_alone_s", alone},
        {"comm_hidden_fraction", hidden},
        {"final_loss", loss},
        {"per_rank", ranks}};
    if (a.json) {
        fmt::print("{}\n", out.dump());
        return;
    }
    fmt::print("bench parallel: {} on {} rank(s) x {} thread(s): {}\n", a.preset, n,
               core::num_threads(), layout.describe());
    fmt::print("  global batch {} x {} tokens: step {:.3f} s, {:.0f} tok/s\n", a.global_batch,
               a.seq, step, tps);
    if (layout.pp() > 1) {
        fmt::print(
            "  bubble: ideal {:.1f}%, replayed from the stages' op times {:.1f}%, "
            "measured (max rank) {:.1f}%\n",
            100 * out["ideal_bubble"].get<double>(), 100 * out["replayed_bubble_max"].get<double>(),
            100 * bubble_max);
    }
    if (layout.dp() > 1) {
        fmt::print(
            "  {} gradient buckets: {:.3f} s alone, {:.3f} s exposed after backward -> "
            "{:.0f}% hidden\n",
            engine.num_buckets(), alone, median(exposed_s), 100 * hidden);
    }
    for (const auto& r : ranks) {
        fmt::print(
            "  rank {} (dp {} tp {} pp {}): compute {:.3f} s, tp comm {:.3f} s ({:.1f} MB), "
            "pipeline wait {:.3f} s ({:.1f}% bubble, {:.1f} MB), dp exposed {:.3f} s, "
            "peak {:.1f} MiB\n",
            r["world_rank"].get<int>(), r["dp"].get<int>(), r["tp"].get<int>(), r["pp"].get<int>(),
            r["compute_s"].get<double>(), r["tp_comm_s"].get<double>(),
            r["tp_bytes"].get<double>() / 1e6, r["pp_wait_s"].get<double>(),
            100 * r["bubble"].get<double>(), r["pp_bytes"].get<double>() / 1e6,
            r["dp_exposed_s"].get<double>(), r["peak_bytes"]["total"].get<double>() / 1048576.0);
    }
}

void add_options(CLI::App* cmd, ParallelArgs& a, bool layouts) {
    cmd->add_option("--preset", a.preset, "model preset")->capture_default_str();
    cmd->add_option("--global-batch", a.global_batch, "sequences per step over all ranks")
        ->check(CLI::Range(1, 1 << 16))
        ->capture_default_str();
    cmd->add_option("--seq", a.seq, "sequence length")
        ->check(CLI::Range(1, 1 << 20))
        ->capture_default_str();
    cmd->add_option("--steps", a.steps, "timed steps (median reported)")
        ->check(CLI::Range(1, 1000))
        ->capture_default_str();
    cmd->add_option("--warmup", a.warmup, "untimed steps first")
        ->check(CLI::Range(0, 100))
        ->capture_default_str();
    cmd->add_option("--threads", a.threads, "threads per rank (0: all cores)")
        ->check(CLI::Range(0, 4096))
        ->capture_default_str();
    cmd->add_option("--zero-stage", a.zero_stage, "ZeRO stage 0-3")
        ->check(CLI::Range(0, 3))
        ->capture_default_str();
    cmd->add_option("--bucket-mb", a.bucket_mb, "gradient bucket size in MiB")
        ->check(CLI::Range(0.001, 1e5))
        ->capture_default_str();
    cmd->add_flag("--json", a.json, "one JSON object");
    if (!layouts) return;
    cmd->add_option("--tp", a.tp, "tensor-parallel ranks")
        ->check(CLI::Range(1, 1 << 10))
        ->capture_default_str();
    cmd->add_option("--pp", a.pp, "pipeline stages")
        ->check(CLI::Range(1, 1 << 10))
        ->capture_default_str();
    cmd->add_option("--microbatches", a.microbatches, "micro-batches per step")
        ->check(CLI::Range(1, 1 << 16))
        ->capture_default_str();
    cmd->add_option("--schedule", a.schedule, "gpipe, 1f1b or interleaved")->capture_default_str();
    cmd->add_option("--virtual-stages", a.virtual_stages,
                    "model chunks per stage (interleaved schedule)")
        ->check(CLI::Range(1, 1 << 10))
        ->capture_default_str();
    cmd->add_option("--recompute", a.recompute, "none, selective or full")->capture_default_str();
    cmd->add_flag("--sequence-parallel", a.sequence_parallel, "sequence parallelism (tp > 1)");
    cmd->add_option("--precision", a.precision, "fp32 or bf16")->capture_default_str();
}

}  // namespace

void add_bench_ddp_command(CLI::App* bench) {
    auto* par = bench->add_subcommand(
        "parallel",
        "training steps under any dp x tp x pp layout on a fixed global batch: step time, "
        "where it goes, bytes and memory per rank; run under mpirun");
    static ParallelArgs p;
    add_options(par, p, true);
    par->callback([] { bench_parallel(p); });
    auto* ddp = bench->add_subcommand(
        "ddp", "data-parallel steps on a fixed global batch (bench parallel with dp only)");
    static ParallelArgs d;
    add_options(ddp, d, false);
    ddp->callback([] { bench_parallel(d); });
}

}  // namespace apiary::cli
