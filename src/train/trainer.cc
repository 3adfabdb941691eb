#include "train/trainer.h"

#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "ckpt/safetensors.h"
#include "core/allocator.h"
#include "core/error.h"
#include "core/model_spec.h"
#include "core/threads.h"
#include "kernels/kernels.h"
#include "model/model.h"
#include "optim/adamw.h"
#include "train/checkpoint.h"
#include "train/corpus.h"

namespace apiary::train {

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

std::atomic<bool> g_stop_requested{false};

namespace {

double seconds_since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string format_duration(double s) {
    if (!std::isfinite(s) || s < 0) return "?";
    const int64_t t = int64_t(s + 0.5);
    if (t >= 3600) return fmt::format("{}h{:02d}m", t / 3600, (t / 60) % 60);
    if (t >= 60) return fmt::format("{}m{:02d}s", t / 60, t % 60);
    return fmt::format("{}s", t);
}

std::string format_rate(double r) {
    if (r >= 1e6) return fmt::format("{:.2f}M", r / 1e6);
    if (r >= 1e3) return fmt::format("{:.1f}k", r / 1e3);
    return fmt::format("{:.0f}", r);
}

// Everything that can be wrong with the config, checked before any file is
// touched or any large buffer allocated.
void validate_layout(const core::Config& c) {
    for (const char* axis : {"parallel.tp", "parallel.pp"}) {
        if (c.get_int(axis) != 1) {
            throw ConfigError(fmt::format(
                "{} = {}: this build trains on one rank without model parallelism; set it to 1",
                axis, c.get_int(axis)));
        }
    }
    if (c.get_int("parallel.dp") > 1) {
        throw ConfigError(fmt::format("parallel.dp = {}: data parallelism needs the MPI runtime, "
                                      "which this build's trainer does not use yet; set it to 1",
                                      c.get_int("parallel.dp")));
    }
    if (c.get_int("parallel.zero_stage") != 0) {
        throw ConfigError("parallel.zero_stage: ZeRO sharding needs data parallelism; set it to 0");
    }
    if (c.get_string("parallel.recompute") != "none") {
        throw ConfigError(fmt::format("parallel.recompute = '{}': activation recomputation is not "
                                      "available yet; set it to 'none'",
                                      c.get_string("parallel.recompute")));
    }
    if (c.get_string("train.precision") != "fp32") {
        throw ConfigError(fmt::format("train.precision = '{}': this build trains in fp32 only",
                                      c.get_string("train.precision")));
    }
    if (c.get_real("train.min_lr") > c.get_real("train.lr")) {
        throw ConfigError(fmt::format("train.min_lr = {} exceeds train.lr = {}",
                                      c.get_real("train.min_lr"), c.get_real("train.lr")));
    }
}

void check_run_dir(const std::string& dir, bool overwrite) {
    if (dir.empty()) throw ConfigError("run.dir is empty");
    if (!fs::exists(dir)) return;
    if (!fs::is_directory(dir)) {
        throw ConfigError(fmt::format("run.dir '{}' exists and is not a directory", dir));
    }
    if (!fs::is_empty(dir) && !overwrite) {
        throw ConfigError(fmt::format("run.dir '{}' already holds a run; pick another with "
                                      "--set run.dir=PATH, or pass --overwrite to replace it",
                                      dir));
    }
}

class MetricsLog {
public:
    explicit MetricsLog(const std::string& path) : out_(path, std::ios::trunc) {
        if (!out_) throw IoError(fmt::format("{}: cannot create", path));
    }
    void write(const json& j) {
        out_ << j.dump() << '\n';
        out_.flush();
    }

private:
    std::ofstream out_;
};

}  // namespace

TrainSummary run_training(const core::Config& c, bool overwrite) {
    // ---- validate everything first ----
    validate_layout(c);
    core::ModelSpec spec = core::model_spec_from(c);
    constexpr int kByteVocab = 256;
    if (c.get_int("model.vocab_size") == 0) spec.vocab_size = kByteVocab;
    if (spec.vocab_size < kByteVocab) {
        throw ConfigError(fmt::format("model.vocab_size = {} is smaller than the byte tokenizer's "
                                      "256 ids",
                                      spec.vocab_size));
    }
    const int64_t B = c.get_int("train.batch_size"), T = c.get_int("train.seq_len");
    const int64_t accum = c.get_int("train.grad_accum"), steps = c.get_int("train.steps");
    if (T > spec.max_seq_len) {
        throw ConfigError(fmt::format("train.seq_len = {} exceeds the model's max_seq_len = {} "
                                      "(raise model.max_seq_len)",
                                      T, spec.max_seq_len));
    }
    const std::string run_dir = c.get_string("run.dir");
    check_run_dir(run_dir, overwrite);
    core::set_num_threads(int(c.get_int("train.threads")));
    const ByteCorpus corpus(c.get_string("data.corpus"), c.get_real("data.val_fraction"), T + 1);

    // ---- allocate ----
    model::Transformer model(spec, B, T);
    const uint64_t seed = uint64_t(c.get_int("train.seed"));
    model.init(seed);
    std::vector<optim::ParamRange> ranges;
    for (const auto& e : model.registry().entries()) {
        ranges.push_back({e.offset, e.numel(), e.decay});
    }
    optim::AdamW adam(ranges, model.flat_size(),
                      {float(c.get_real("train.beta1")), float(c.get_real("train.beta2")),
                       float(c.get_real("train.eps")), float(c.get_real("train.weight_decay")),
                       float(c.get_real("train.grad_clip"))});

    // ---- only now touch the run directory ----
    if (fs::exists(run_dir)) fs::remove_all(run_dir);
    fs::create_directories(run_dir);
    const std::string config_text = c.to_toml();
    ckpt::atomic_write((fs::path(run_dir) / "config.toml").string(), config_text.data(),
                       config_text.size());
    MetricsLog metrics((fs::path(run_dir) / "metrics.jsonl").string());

    const double peak = kernels::measure_gemm_peak_flops(0.2);
    const double flops_per_token = spec.train_flops_per_token(int(T));
    const int64_t tokens_per_step = B * T * accum;
    fmt::print("apiary train: {} model, {:.2f}M parameters, {} layers, C={}, V={}\n",
               core::arch_name(spec.arch), double(spec.num_params()) / 1e6, spec.n_layer,
               spec.n_embd, spec.vocab_size);
    fmt::print("  corpus {}: {:.2f} MB train, {:.2f} MB held out; unigram loss {:.3f} nats\n",
               corpus.source(), double(corpus.train_size()) / 1e6, double(corpus.val_size()) / 1e6,
               corpus.unigram_entropy());
    fmt::print("  {} steps x {} tokens (B={} T={} accum={}), {} threads, GEMM peak {:.0f} GFLOP/s\n",
               steps, tokens_per_step, B, T, accum, core::num_threads(), peak / 1e9);
    fmt::print("  run directory {}\n", run_dir);
    std::fflush(stdout);

    std::vector<int32_t> tokens(size_t(B * T)), targets(size_t(B * T));
    auto evaluate = [&](int64_t step) {
        double loss = 0;
        int64_t count = 0;
        for (int64_t i = 0; i < c.get_int("train.eval_batches"); ++i) {
            corpus.batch(true, seed, 0, i, B, T, tokens.data(), targets.data());
            const auto r = model.evaluate(tokens.data(), targets.data(), B, T);
            loss += r.loss_sum;
            count += r.count;
        }
        const double mean = loss / double(std::max<int64_t>(1, count));
        metrics.write({{"step", step}, {"eval_loss", mean}});
        return mean;
    };

    TrainSummary summary;
    summary.unigram_loss = corpus.unigram_entropy();
    const int64_t warmup = c.get_int("train.warmup_steps");
    const double lr_peak = c.get_real("train.lr"), lr_min = c.get_real("train.min_lr");
    const int64_t log_every = c.get_int("train.log_every"), eval_every = c.get_int("train.eval_every");
    const int64_t ckpt_every = c.get_int("train.ckpt_every");
    const bool tty = ::isatty(STDOUT_FILENO);
    const auto t_start = Clock::now();
    double window_loss = 0, window_time = 0;
    int64_t window_steps = 0;
    double last_eval = NAN;
    int64_t step = 0;
    auto extra_meta = [&] {
        return json{{"tokenizer", c.get_string("data.tokenizer")},
                    {"config_hash", fmt::format("{:016x}", c.hash())}};
    };
    for (; step < steps && !g_stop_requested.load(); ++step) {
        const auto t0 = Clock::now();
        model.zero_grads();
        double loss_sum = 0;
        int64_t count = 0;
        const float grad_scale = 1.0f / float(B * T * accum);
        for (int64_t micro = 0; micro < accum; ++micro) {
            corpus.batch(false, seed, step, micro, B, T, tokens.data(), targets.data());
            const auto r = model.forward_backward(tokens.data(), targets.data(), B, T, grad_scale);
            loss_sum += r.loss_sum;
            count += r.count;
        }
        const double lr = optim::lr_schedule(step, steps, warmup, lr_peak, lr_min);
        const double grad_norm = adam.step(model.params(), model.grads(), float(lr));
        const double dt = seconds_since(t0);
        const double loss = loss_sum / double(count);
        if (!std::isfinite(loss)) {
            throw Error(fmt::format("training diverged at step {}: loss is {}; lower train.lr "
                                    "(now {}) or raise train.warmup_steps",
                                    step + 1, loss, lr_peak));
        }
        window_loss += loss;
        window_time += dt;
        window_steps += 1;
        const bool last = step + 1 == steps;
        if ((eval_every > 0 && (step + 1) % eval_every == 0) || last) last_eval = evaluate(step + 1);
        if ((step + 1) % log_every == 0 || last) {
            const double tps = double(tokens_per_step * window_steps) / window_time;
            const double mfu = tps * flops_per_token / peak;
            const double eta = double(steps - step - 1) * window_time / double(window_steps);
            metrics.write({{"step", step + 1}, {"loss", window_loss / double(window_steps)},
                           {"lr", lr}, {"grad_norm", grad_norm},
                           {"step_time_s", window_time / double(window_steps)},
                           {"tokens_per_s", tps}, {"mfu", mfu}, {"world_size", 1},
                           {"tokens", (step + 1) * tokens_per_step},
                           {"elapsed_s", seconds_since(t_start)}});
            const std::string eval_part =
                std::isnan(last_eval) ? "" : fmt::format(" | val {:.4f}", last_eval);
            fmt::print("{}step {:>{}}/{} | loss {:.4f}{} | lr {:.2e} | {} tok/s | MFU {:.1f}% | "
                       "ETA {}{}",
                       tty ? "\r\033[K" : "", step + 1, int(std::to_string(steps).size()), steps,
                       window_loss / double(window_steps), eval_part, lr, format_rate(tps),
                       100.0 * mfu, format_duration(eta), tty && !last ? "" : "\n");
            std::fflush(stdout);
            summary.final_train_loss = window_loss / double(window_steps);
            summary.tokens_per_s = tps;
            window_loss = window_time = 0;
            window_steps = 0;
        }
        if (ckpt_every > 0 && (step + 1) % ckpt_every == 0 && !last) {
            save_checkpoint(run_dir, step + 1, model, &adam, extra_meta());
        }
    }
    if (g_stop_requested.load()) {
        fmt::print("\ninterrupted at step {}: saving a checkpoint\n", step);
        last_eval = evaluate(step);
    }
    summary.steps = step;
    summary.final_eval_loss = last_eval;
    summary.checkpoint_dir = save_checkpoint(run_dir, step, model, &adam, extra_meta());
    const auto mem = core::mem_stats();
    fmt::print("done: {} steps in {}, val loss {:.4f} (unigram {:.4f}), peak memory {:.1f} MiB; "
               "checkpoint {}\n",
               step, format_duration(seconds_since(t_start)), last_eval, summary.unigram_loss,
               double(mem.total_peak) / 1048576.0, summary.checkpoint_dir);
    return summary;
}

}  // namespace apiary::train
