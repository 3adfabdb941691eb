#include "train/trainer.h"

#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>

#include "ckpt/safetensors.h"
#include "comm/mesh.h"
#include "core/allocator.h"
#include "core/error.h"
#include "core/model_spec.h"
#include "core/signals.h"
#include "core/threads.h"
#include "data/file_io.h"
#include "data/loader.h"
#include "kernels/kernels.h"
#include "model/model.h"
#include "optim/adamw.h"
#include "optim/loss_scaler.h"
#include "parallel/data_parallel.h"
#include "train/checkpoint.h"
#include "train/run_dir.h"
#include "train/schedule.h"
#include "train/train_data.h"

namespace apiary::train {

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

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
    // Keys the planner models but the trainer cannot train (yet).
    for (const char* axis : {"parallel.cp", "parallel.ep"}) {
        if (c.get_int(axis) != 1) {
            throw ConfigError(fmt::format("{} = {}: context and expert parallelism are modelled by "
                                          "`apiary plan` only; the trainer needs it to be 1",
                                          axis, c.get_int(axis)));
        }
    }
    if (c.get_string("train.precision") == "fp8") {
        throw ConfigError("train.precision = 'fp8' is modelled by `apiary plan` only; the trainer "
                          "trains in fp32, bf16 or fp16");
    }
    if (const std::string what = core::model_spec_from(c).trainer_unsupported(); !what.empty()) {
        throw ConfigError(fmt::format("{}: `apiary plan` models it, the trainer does not train it; "
                                      "leave it unset for apiary train",
                                      what));
    }
    for (const char* axis : {"parallel.tp", "parallel.pp"}) {
        if (c.get_int(axis) != 1) {
            throw ConfigError(fmt::format(
                "{} = {}: this build trains on one rank without model parallelism; set it to 1",
                axis, c.get_int(axis)));
        }
    }
    parallel::DataParallel::check_stage(int(c.get_int("parallel.zero_stage")));
    if (c.get_int("parallel.zero_stage") == 3 && c.get_string("train.precision") == "fp16") {
        throw ConfigError(
            "parallel.zero_stage = 3 with train.precision = 'fp16': sharded parameters take fp32 "
            "or bf16 (the emulated fp16 weight copy is made for the whole model at once); use "
            "stage 2 or bf16");
    }
    if (c.get_string("parallel.recompute") != "none") {
        throw ConfigError(
            fmt::format("parallel.recompute = '{}': activation recomputation is not "
                        "available yet; set it to 'none'",
                        c.get_string("parallel.recompute")));
    }
    if (c.get_bool("parallel.sequence_parallel")) {
        throw ConfigError(
            "parallel.sequence_parallel = true needs tensor parallelism "
            "(parallel.tp > 1), which this build's trainer does not have");
    }
    if (c.get_int("data.curriculum_start") > 0 && c.get_int("data.curriculum_steps") == 0) {
        throw ConfigError(
            fmt::format("data.curriculum_start = {} needs data.curriculum_steps > 0 "
                        "(the steps over which it grows to train.seq_len)",
                        c.get_int("data.curriculum_start")));
    }
    if (c.get_real("train.min_lr") > c.get_real("train.lr")) {
        throw ConfigError(fmt::format("train.min_lr = {} exceeds train.lr = {}",
                                      c.get_real("train.min_lr"), c.get_real("train.lr")));
    }
}

std::set<int64_t> parse_step_list(const std::string& text, const char* key) {
    std::set<int64_t> out;
    std::stringstream ss(text);
    std::string item;
    while (std::getline(ss, item, ',')) {
        if (item.empty()) continue;
        try {
            size_t used = 0;
            const int64_t v = std::stoll(item, &used);
            if (used != item.size() || v < 1) throw std::invalid_argument(item);
            out.insert(v);
        } catch (const std::exception&) {
            throw ConfigError(
                fmt::format("{} = '{}': '{}' is not a step number (1, 2, ...)", key, text, item));
        }
    }
    return out;
}

// One training run: built (and fully validated) by the constructor, driven
// by run(). Resuming is the same object with state loaded before run().
class Trainer {
  public:
    // dp_group: the data-parallel group when launched with several ranks.
    Trainer(const core::Config& c, const TrainData& data, comm::ProcessGroup* dp_group)
        : c_(c),
          data_(data),
          spec_(resolve_spec(c, data)),
          B_(c.get_int("train.batch_size")),
          T_(c.get_int("train.seq_len")),
          accum_(c.get_int("train.grad_accum")),
          steps_(c.get_int("train.steps")),
          seed_(uint64_t(c.get_int("train.seed"))),
          run_dir_(c.get_string("run.dir")),
          precision_(model::parse_precision(c.get_string("train.precision"))),
          inject_(parse_step_list(c.get_string("debug.inject_overflow_steps"),
                                  "debug.inject_overflow_steps")),
          dp_size_(dp_group ? dp_group->size() : 1),
          dp_rank_(dp_group ? dp_group->rank() : 0),
          // Measured before the data is prepared: a first run's tokenizer
          // training and shard writes would otherwise share the cores with
          // the measurement and make MFU read several times too high.
          peak_(precision_ == model::Precision::bf16 ? kernels::measure_gemm_bf16_peak_flops(0.2)
                                                     : kernels::measure_gemm_peak_flops(0.2)),
          train_data_(make_loader(c, data, dp_group, "train")),
          val_data_(make_loader(c, data, dp_group, "val")),
          val_start_(val_data_->state()),
          schedule_(steps_, c.get_int("train.warmup_steps"), c.get_real("train.lr"),
                    c.get_real("train.min_lr"), c.get_string("train.lr_schedule_by") == "tokens",
                    c.get_int("data.curriculum_start") > 0 ? c.get_int("data.curriculum_steps") : 0,
                    [&](int64_t step) {
                        const auto [b, t] = train_data_->shape_at(step);
                        return b * t * dp_size_;
                    }),
          zero_stage_(dp_group ? int(c.get_int("parallel.zero_stage")) : 0),
          model_(spec_, B_, T_, precision_, parallel::DataParallel::shard_multiple(dp_size_),
                 parallel::DataParallel::storage_for(zero_stage_)),
          scaler_(
              {c.get_real("train.loss_scale_init"), 2.0, 0.5,
               c.get_int("train.loss_scale_growth_interval"), c.get_real("train.loss_scale_min")},
              precision_ == model::Precision::fp16) {
        tokens_.resize(size_t(B_ * T_));
        targets_.resize(size_t(B_ * T_));
        if (dp_group) {
            dp_ = std::make_unique<parallel::DataParallel>(
                *dp_group, model_, c.get_real("comm.bucket_mb"),
                int(c.get_int("parallel.zero_stage")), c.get_string("comm.grad_dtype") == "bf16");
        }
        // Under ZeRO 1-3 the optimizer sees this rank's packed shard only.
        adam_ = std::make_unique<optim::AdamW>(
            dp_ ? dp_->optimizer_ranges() : ranges(model_),
            dp_ ? dp_->optimizer_size() : model_.flat_size(),
            optim::AdamWOptions{float(c.get_real("train.beta1")), float(c.get_real("train.beta2")),
                                float(c.get_real("train.eps")),
                                float(c.get_real("train.weight_decay")),
                                float(c.get_real("train.grad_clip"))});
    }

    void init_fresh() {
        if (zero_stage_ == 3) {
            // Every element is a pure function of (seed, name, index): the
            // whole model is made once here and each rank keeps its pieces.
            std::vector<float> full(size_t(model_.flat_size()));
            model_.init_into(seed_, full.data());
            dp_->load_parameters(full.data());
            return;
        }
        model_.init(seed_);
        if (dp_) dp_->load_parameters(model_.params());
    }

    // Loads weights, optimizer state, loss scaler and step from a checkpoint.
    void load(const CheckpointRef& ck) {
        // The data first: a changed tokenizer also changes the model's
        // vocabulary, and should be named as what changed.
        restore_data(ck);
        // The config may change the run's length or logging, not the model.
        const json have = spec_to_json(spec_), saved = ck.meta["model"];
        if (have != saved) {
            throw ConfigError(
                fmt::format("{}/meta.json: the checkpoint is of model {}, but the "
                            "config describes {}; resume without changing model.*",
                            ck.dir, saved.dump(), have.dump()));
        }
        if (zero_stage_ == 3) {
            std::vector<float> full(size_t(model_.flat_size()));
            load_weights(ck, model_, full.data());
            dp_->load_parameters(full.data());
        } else {
            load_weights(ck, model_);
            if (dp_) dp_->load_parameters(model_.params());
        }
        // The file holds the whole optimizer state; this rank keeps its shard
        // (so a run may resume on a different number of ranks).
        std::vector<float> m(size_t(model_.flat_size())), v(size_t(model_.flat_size()));
        adam_->set_step_count(load_optimizer_state(ck, model_, m.data(), v.data()));
        if (zero_stage_ >= 1) {
            dp_->pack(m.data(), adam_->m());
            dp_->pack(v.data(), adam_->v());
        } else {
            std::copy(m.begin(), m.end(), adam_->m());
            std::copy(v.begin(), v.end(), adam_->v());
        }
        if (ck.meta.contains("loss_scaler")) scaler_.restore(ck.meta["loss_scaler"]);
        // Every step either updated the weights or was skipped for overflow.
        if (adam_->step_count() != ck.step - scaler_.skipped_steps()) {
            throw IoError(
                fmt::format("{}: the optimizer has taken {} steps, but meta.json says "
                            "step {} with {} skipped (checkpoint damaged)",
                            ck.dir, adam_->step_count(), ck.step, scaler_.skipped_steps()));
        }
        start_step_ = ck.step;
        if (start_step_ >= steps_) {
            throw ConfigError(
                fmt::format("{}: the run already reached step {} of train.steps = {}; "
                            "raise it with --set train.steps=N to train further",
                            run_dir_, start_step_, steps_));
        }
    }

    TrainSummary run(bool append_metrics);

  private:
    static core::ModelSpec resolve_spec(const core::Config& c, const TrainData& data) {
        validate_layout(c);
        core::ModelSpec spec = core::model_spec_from(c);
        // The vocabulary is the tokenizer's; a larger model.vocab_size pads
        // it (rows no token uses), a smaller one cannot hold its ids.
        const int64_t V = c.get_int("model.vocab_size");
        if (V == 0) {
            spec.vocab_size = int(data.vocab_size);
        } else if (V < data.vocab_size) {
            throw ConfigError(
                fmt::format("{}: the shards' tokenizer has {} tokens, more than "
                            "model.vocab_size = {}; raise it, or set it to 0 to "
                            "take the tokenizer's",
                            data.manifest, data.vocab_size, V));
        }
        const int64_t T = c.get_int("train.seq_len");
        if (T > spec.max_seq_len) {
            throw ConfigError(
                fmt::format("train.seq_len = {} exceeds the model's max_seq_len = {} "
                            "(raise model.max_seq_len)",
                            T, spec.max_seq_len));
        }
        core::set_num_threads(int(c.get_int("train.threads")));
        return spec;
    }
    static std::unique_ptr<data::Loader> make_loader(const core::Config& c, const TrainData& d,
                                                     comm::ProcessGroup* dp,
                                                     const std::string& split) {
        auto o =
            data::LoaderOptions::from_config(c, dp ? dp->rank() : 0, dp ? dp->size() : 1, split);
        o.sources = d.sources;
        o.tokenizer_hash = d.tokenizer_hash;
        if (split == "train") {
            // One loader step is one optimizer step: B * grad_accum windows
            // per rank, which the micro-steps take B at a time. The global
            // batch is then the same windows for any dp size with the same
            // dp * B * grad_accum, and the curriculum counts optimizer steps.
            o.batch_size *= c.get_int("train.grad_accum");
        } else {
            o.prefetch = 0;  // read on demand, from the start at every evaluation
        }
        return std::make_unique<data::Loader>(o);
    }
    static std::vector<optim::ParamRange> ranges(const model::Transformer& m) {
        std::vector<optim::ParamRange> r;
        for (const auto& e : m.registry().entries()) r.push_back({e.offset, e.numel(), e.decay});
        return r;
    }
    double evaluate();
    // Entropy (nats) of the training stream's unigram distribution: the
    // loss of the best model that ignores context (from up to 16M tokens
    // per source).
    double unigram_entropy() const {
        double h = 0;
        for (double p : train_data_->unigram(uint64_t(16) << 20)) {
            if (p > 0) h -= p * std::log(p);
        }
        return h;
    }
    void restore_data(const CheckpointRef& ck);
    // Rows [first, first + n) of a loader batch as inputs and targets (n, T).
    void unpack(const data::Batch& b, int64_t first, int64_t n) {
        for (int64_t i = 0; i < n; ++i) {
            const int32_t* row = b.row(first + i);
            std::copy_n(row, b.T, tokens_.data() + i * b.T);
            std::copy_n(row + 1, b.T, targets_.data() + i * b.T);
        }
    }
    bool main_rank() const { return dp_rank_ == 0; }
    std::string save(int64_t step) {
        // Collective under ZeRO (the optimizer shards are gathered); only
        // the first rank writes.
        const int64_t flat = model_.flat_size();
        std::vector<float> m, v, p;
        const float* mp = adam_->m();
        const float* vp = adam_->v();
        if (zero_stage_ >= 1) {
            m.resize(size_t(flat));
            v.resize(size_t(flat));
            dp_->gather_full(adam_->m(), m.data());
            dp_->gather_full(adam_->v(), v.data());
            mp = m.data();
            vp = v.data();
        }
        if (zero_stage_ == 3) {
            p.resize(size_t(flat));
            dp_->gather_full(dp_->optimizer_params(), p.data());
        }
        if (!main_rank()) return "";
        return save_checkpoint(run_dir_, step, model_, {mp, vp, adam_->step_count()},
                               checkpoint_meta(), p.empty() ? nullptr : p.data(),
                               c_.get_int("train.ckpt_keep"));
    }
    // Rank 0 prints; every rank writes the same lines to its own log in the
    // run directory (logs/rank_NNNNN.log), with what it alone knows added
    // by note().
    template <typename... Args>
    void say(fmt::format_string<Args...> f, Args&&... args) {
        const std::string text = fmt::format(f, std::forward<Args>(args)...);
        if (main_rank()) fmt::print("{}", text);
        note(text);
    }
    void note(std::string text) {
        if (!rank_log_.is_open()) return;
        // Terminal line rewrites ("\r\033[K") are for the console only.
        for (size_t at; (at = text.find("\r\033[K")) != std::string::npos;) text.erase(at, 4);
        if (text.empty()) return;
        rank_log_ << text;
        if (text.back() != '\n') rank_log_ << '\n';
        rank_log_.flush();
    }
    void open_rank_log(bool append) {
        const fs::path dir = fs::path(run_dir_) / "logs";
        fs::create_directories(dir);
        const std::string path = (dir / fmt::format("rank_{:05d}.log", dp_rank_)).string();
        rank_log_.open(path, append ? std::ios::app : std::ios::trunc);
        if (!rank_log_) throw IoError(fmt::format("{}: cannot open for writing", path));
    }
    json checkpoint_meta() const {
        return {{"tokenizer", data_.tokenizer_json.empty() ? "" : kTokenizerFile},
                {"tokenizer_hash", data_.tokenizer_hash},
                // Where the training stream continues (global, the same on every rank).
                {"loader", train_data_->state()},
                {"config_hash", fmt::format("{:016x}", c_.hash())},
                {"precision", c_.get_string("train.precision")},
                // Positions beyond the trained length were never trained:
                // generation keeps its window within it.
                {"seq_len", T_},
                {"loss_scaler", scaler_.state()}};
    }

    const core::Config& c_;
    const TrainData& data_;
    core::ModelSpec spec_;
    int64_t B_, T_, accum_, steps_;
    uint64_t seed_;
    std::string run_dir_;
    model::Precision precision_;
    std::set<int64_t> inject_;
    int dp_size_, dp_rank_;
    double peak_;  // matmul FLOP/s of one rank in the run's precision
    std::unique_ptr<data::Loader> train_data_, val_data_;
    nlohmann::json val_start_;  // every evaluation reads the same held-out windows
    LrSchedule schedule_;
    int zero_stage_;  // 0 without data parallelism
    model::Transformer model_;
    optim::LossScaler scaler_;
    std::unique_ptr<parallel::DataParallel> dp_;
    std::unique_ptr<optim::AdamW> adam_;
    std::vector<int32_t> tokens_, targets_;
    int64_t start_step_ = 0;
    std::ofstream rank_log_;
};

double Trainer::evaluate() {
    double loss = 0;
    int64_t count = 0;
    val_data_->restore(val_start_);
    for (int64_t i = 0; i < c_.get_int("train.eval_batches"); ++i) {
        const data::Batch& b = val_data_->next_batch();
        unpack(b, 0, b.B);
        const auto r = model_.evaluate(tokens_.data(), targets_.data(), b.B, b.T);
        loss += r.loss_sum;
        count += r.count;
    }
    if (dp_) {
        loss = dp_->sum(loss);
        count = int64_t(dp_->sum(double(count)));
    }
    return loss / double(std::max<int64_t>(1, count));
}

void Trainer::restore_data(const CheckpointRef& ck) {
    const std::string where = ck.dir + "/meta.json";
    if (!ck.meta.contains("loader")) {
        throw ConfigError(
            fmt::format("{}: no loader state (a checkpoint from before apiary train "
                        "read token shards); it cannot continue with the same "
                        "batches: start a new run",
                        where));
    }
    const std::string hash = ck.meta.value("tokenizer_hash", "");
    if (hash != data_.tokenizer_hash) {
        throw ConfigError(
            fmt::format("{}: the run was trained with tokenizer {}, but the data.* "
                        "keys now give {} ({}); resume with the run's data settings",
                        where, hash, data_.tokenizer_hash, data_.manifest));
    }
    train_data_->restore(ck.meta["loader"]);
    if (train_data_->step() != ck.step) {
        throw IoError(
            fmt::format("{}: the loader state is at step {}, the checkpoint at step {} "
                        "(checkpoint damaged)",
                        where, train_data_->step(), ck.step));
    }
}

TrainSummary Trainer::run(bool append_metrics) {
    open_rank_log(append_metrics);
    std::optional<MetricsLog> metrics;
    if (main_rank()) metrics.emplace((fs::path(run_dir_) / kMetricsFile).string(), append_metrics);
    const double peak = peak_;
    const int64_t tokens_per_step = B_ * T_ * accum_ * dp_size_;  // at the full shape
    say("apiary train: {} model, {:.2f}M parameters, {} layers, C={}, V={}, {}\n",
        core::arch_name(spec_.arch), double(spec_.num_params()) / 1e6, spec_.n_layer, spec_.n_embd,
        spec_.vocab_size, c_.get_string("train.precision"));
    // The unigram baseline is computed by the first rank only (it prints it).
    const double unigram = main_rank() ? unigram_entropy() : 0.0;
    uint64_t split_tokens[2] = {0, 0};
    for (size_t s = 0; s < train_data_->num_sources(); ++s) {
        for (const auto& sh : train_data_->manifest(s).shards) {
            split_tokens[sh.split == "val"] += sh.tokens;
        }
    }
    say("  data {}\n", data_.description);
    say("  {:.2f}M train + {:.2f}M held-out tokens{}; unigram loss {:.3f} nats/token\n",
        double(split_tokens[0]) / 1e6, double(split_tokens[1]) / 1e6,
        data_.bytes_per_token > 0 ? fmt::format(" ({:.2f} bytes/token)", data_.bytes_per_token)
                                  : "",
        unigram);
    if (c_.get_int("data.curriculum_start") > 0) {
        const auto [b0, t0] = train_data_->shape_at(0);
        say("  curriculum ({}): step 1 has micro-batches of {} rows x T={}, growing to T={} by "
            "step {}; LR schedule by {}\n",
            c_.get_string("data.curriculum_mode"), b0 / accum_, t0, T_,
            c_.get_int("data.curriculum_steps") + 1, c_.get_string("train.lr_schedule_by"));
    }
    say("  {} steps x {} tokens (B={} T={} accum={} dp={}{}), {} threads/rank, matmul peak "
        "{:.0f} GFLOP/s/rank\n",
        steps_, tokens_per_step, B_, T_, accum_, dp_size_,
        dp_ && dp_->zero_stage() ? fmt::format(" zero={}", dp_->zero_stage()) : "",
        core::num_threads(), peak / 1e9);
    say("  run directory {}{}\n", run_dir_,
        start_step_ ? fmt::format(", resuming after step {}", start_step_) : "");
    std::fflush(stdout);

    TrainSummary summary;
    summary.unigram_loss = unigram;
    const double lr_peak = c_.get_real("train.lr");
    const int64_t log_every = c_.get_int("train.log_every");
    const int64_t eval_every = c_.get_int("train.eval_every");
    const int64_t ckpt_every = c_.get_int("train.ckpt_every");
    const bool tty = ::isatty(STDOUT_FILENO);
    const auto t_start = Clock::now();
    double window_loss = 0, window_time = 0, window_flops = 0;
    int64_t window_steps = 0, window_tokens = 0;
    double last_eval = NAN;
    int64_t step = start_step_;
    // Under data parallelism the loop ends only on a stop every rank agreed
    // on (a signal read directly could reach ranks at different steps).
    bool stop = false;
    bool stop_agreed = false;
    for (; step < steps_ && !stop; ++step) {
        const auto t0 = Clock::now();
        if (dp_) {
            dp_->zero_grads();
        } else {
            model_.zero_grads();
        }
        double loss_sum = 0;
        int64_t count = 0;
        // This rank's windows of the step, (rows, T + 1): B_t rows of T_t,
        // which vary under a curriculum; the micro-steps take them in turn.
        const data::Batch& batch = train_data_->next_batch();
        APIARY_CHECK(batch.step == step && batch.B % accum_ == 0,
                     "loader batch of step {} with {} rows at step {}, grad_accum {}", batch.step,
                     batch.B, step, accum_);
        const int64_t rows = batch.B / accum_, T = batch.T;
        // fp16: the loss (and so every gradient) is multiplied by the scale.
        const double scale = scaler_.scale();
        // Each rank's gradients are of its mean loss; the all-reduce averages
        // them over ranks: the gradient of the mean over the global batch.
        const float grad_scale = float(scale / double(rows * T * accum_));
        for (int64_t micro = 0; micro < accum_; ++micro) {
            const bool last_micro = micro + 1 == accum_;
            unpack(batch, micro * rows, rows);
            // Testing hook: an overflowing loss scale on the last rank only;
            // the all-reduce carries it to every rank.
            const bool poison = last_micro && inject_.count(step + 1) && dp_rank_ == dp_size_ - 1;
            if (dp_) dp_->begin_micro_step(last_micro);
            const auto r = model_.forward_backward(
                tokens_.data(), targets_.data(), rows, T,
                poison ? std::numeric_limits<float>::infinity() : grad_scale);
            loss_sum += r.loss_sum;
            count += r.count;
        }
        if (dp_) {
            dp_->finish_gradients();
            // One small all-reduce for the step's scalars. A stop signal may
            // reach one rank only: every rank stops after the same step.
            float scalars[3] = {float(loss_sum), float(count),
                                core::stop_requested() ? 1.0f : 0.0f};
            dp_->sum(scalars, 3);
            loss_sum = scalars[0];
            count = int64_t(scalars[1]);
            stop_agreed = scalars[2] > 0;
        }
        // After the all-reduce every rank holds the same gradients, so every
        // rank reaches the same overflow decision from the same norm.
        const double raw_norm = dp_ ? dp_->grad_norm(*adam_) : adam_->grad_norm(model_.grads());
        const bool overflow = !std::isfinite(raw_norm);
        const double lr = schedule_.at(step);
        const bool apply = scaler_.update(overflow, step + 1);
        if (apply) {
            // bf16: the optimizer writes the bf16 weight copy as it goes, when it
            // updates every parameter (not under ZeRO: there the gather below
            // marks the copy stale, and it is cast again before the forward).
            const bool whole = (!dp_ || dp_->zero_stage() == 0) && adam_->updates_all_params();
            uint16_t* copy = whole ? model_.bf16_weights() : nullptr;
            adam_->step(dp_ ? dp_->optimizer_params() : model_.params(),
                        dp_ ? dp_->optimizer_grads() : model_.grads(), float(lr),
                        float(1.0 / scale), raw_norm, copy);
            if (copy) model_.bf16_weights_written();
            if (dp_) dp_->gather_parameters();
        } else if (!scaler_.enabled()) {
            throw Error(
                fmt::format("non-finite gradients at step {} (norm {}): training "
                            "diverged; lower train.lr (now {}) or raise "
                            "train.warmup_steps",
                            step + 1, raw_norm, lr_peak));
        } else {
            say("{}step {}: fp16 gradients overflowed; step skipped, loss scale now {}\n",
                tty ? "\r\033[K" : "", step + 1, scaler_.scale());
        }
        const double dt = seconds_since(t0);
        const double loss = loss_sum / double(count);
        if (!std::isfinite(loss)) {
            throw Error(
                fmt::format("training diverged at step {}: loss is {}; lower train.lr "
                            "(now {}) or raise train.warmup_steps",
                            step + 1, loss, lr_peak));
        }
        window_loss += loss;
        window_time += dt;
        window_steps += 1;
        window_tokens += rows * T * accum_ * dp_size_;
        window_flops += double(rows * T * accum_ * dp_size_) * spec_.train_flops_per_token(int(T));
        const bool last = step + 1 == steps_;
        if ((eval_every > 0 && (step + 1) % eval_every == 0) || last) {
            last_eval = evaluate();
            if (metrics) metrics->write({{"step", step + 1}, {"eval_loss", last_eval}});
        }
        if ((step + 1) % log_every == 0 || last) {
            const double tps = double(window_tokens) / window_time;
            const double mfu = window_flops / window_time / peak;  // over all ranks' peaks below
            const double eta = double(steps_ - step - 1) * window_time / double(window_steps);
            json rec = {{"step", step + 1},
                        {"loss", window_loss / double(window_steps)},
                        {"lr", lr},
                        {"grad_norm", raw_norm / scale},
                        {"step_time_s", window_time / double(window_steps)},
                        {"tokens_per_s", tps},
                        {"mfu", mfu / dp_size_},
                        {"world_size", dp_size_},
                        {"tokens", schedule_.tokens_before(step + 1)},
                        {"elapsed_s", seconds_since(t_start)}};
            if (scaler_.enabled()) {
                rec["loss_scale"] = scaler_.scale();
                rec["skipped_steps"] = scaler_.skipped_steps();
                rec["overflows"] = scaler_.overflows();
            }
            if (dp_) rec["comm_exposed_s"] = dp_->exposed_seconds();
            // Which tokens the step trained on (the first rank's windows):
            // runs that must see the same data compare these.
            rec["batch_xxh64"] = data::hex64(
                data::xxhash64(batch.tokens.data(), batch.tokens.size() * sizeof(int32_t)));
            if (metrics) metrics->write(rec);
            if (dp_) {
                note(
                    fmt::format("rank {}: step {} took {:.3f} s, {:.3f} s waiting on gradient "
                                "communication",
                                dp_rank_, step + 1, dt, dp_->exposed_seconds()));
            }
            const std::string eval_part =
                std::isnan(last_eval) ? "" : fmt::format(" | val {:.4f}", last_eval);
            const std::string scale_part =
                scaler_.enabled() ? fmt::format(" | scale {:g}", scaler_.scale()) : "";
            say("{}step {:>{}}/{} | loss {:.4f}{} | lr {:.2e}{} | {} tok/s | MFU {:.1f}% | ETA "
                "{}{}",
                tty ? "\r\033[K" : "", step + 1, int(std::to_string(steps_).size()), steps_,
                window_loss / double(window_steps), eval_part, lr, scale_part, format_rate(tps),
                100.0 * mfu / dp_size_, format_duration(eta), tty && !last ? "" : "\n");
            std::fflush(stdout);
            summary.final_train_loss = window_loss / double(window_steps);
            summary.tokens_per_s = tps;
            window_loss = window_time = window_flops = 0;
            window_steps = window_tokens = 0;
        }
        if (ckpt_every > 0 && (step + 1) % ckpt_every == 0 && !last) {
            save(step + 1);
        }
        stop = dp_ ? stop_agreed : core::stop_requested();
    }
    if (stop) {
        say("\ninterrupted after step {}: saving a checkpoint (resume with `apiary train "
            "--resume {}`)\n",
            step, run_dir_);
        last_eval = evaluate();
    }
    summary.steps = step;
    summary.interrupted = stop;
    summary.final_eval_loss = last_eval;
    summary.skipped_steps = scaler_.skipped_steps();
    summary.loss_scale = scaler_.scale();
    summary.checkpoint_dir = save(step);
    const auto mem = core::mem_stats();
    if (metrics) {
        json peak_bytes;
        for (int k = 0; k < core::kNumMemCategories; ++k) {
            peak_bytes[core::category_name(core::MemCategory(k))] = mem.peak[k];
        }
        // The ZeRO closed form next to the accounting (params + grads +
        // optimizer), per rank.
        metrics->write({{"step", step},
                        {"memory_peak_bytes_per_rank", peak_bytes},
                        {"model_state_formula_bytes", parallel::DataParallel::model_state_formula(
                                                          model_, zero_stage_, dp_size_)}});
    }
    // Bits per byte compare runs of different tokenizers on the same text.
    const std::string per_byte =
        data_.bytes_per_token > 0
            ? fmt::format(", {:.3f} bits/byte", last_eval / std::log(2.0) / data_.bytes_per_token)
            : "";
    say("done: {} steps in {}, val loss {:.4f} nats/token{} (unigram {:.4f}), peak memory "
        "{:.1f} MiB; checkpoint {}\n",
        step, format_duration(seconds_since(t_start)), last_eval, per_byte, summary.unigram_loss,
        double(mem.total_peak) / 1048576.0, summary.checkpoint_dir);
    if (metrics && metrics->lost() > 0) {
        fmt::print(stderr,
                   "apiary: warning: {} records could not be written to {} (see the warnings "
                   "above); the checkpoint is complete\n",
                   metrics->lost(), metrics->path());
    }
    return summary;
}

}  // namespace

namespace {

// The data-parallel group of this rank, after checking the layout against
// the world (all ranks hold the same config: checked by hash first).
comm::ProcessGroup* data_parallel_group(const core::Config& c, comm::ProcessGroup* world,
                                        std::unique_ptr<comm::DeviceMesh>& mesh) {
    const int world_size = world ? world->size() : 1;
    const comm::MeshShape shape = comm::mesh_shape_from(c, world_size);
    if (!world || world_size == 1) return nullptr;
    comm::check_config_hash(*world, c.hash());
    mesh = std::make_unique<comm::DeviceMesh>(
        std::shared_ptr<comm::ProcessGroup>(world, [](comm::ProcessGroup*) {}), shape);
    return &mesh->dp();
}

void barrier(comm::ProcessGroup* world) {
    if (world && world->size() > 1) world->barrier({"run_dir", 0})->wait();
}

// What every rank reads: the first rank builds whatever the cache lacks,
// then the others find it there (or, without a shared file system, build
// the same bytes themselves).
TrainData shared_train_data(const core::Config& c, comm::ProcessGroup* world) {
    const bool first = !world || world->rank() == 0;
    TrainData d;
    if (first) d = resolve_train_data(c, true);
    barrier(world);
    if (!first) d = resolve_train_data(c, false);
    return d;
}

// The run's tokenizer.json, for `apiary generate` (none when unknown).
void save_tokenizer(const std::string& run_dir, const TrainData& d) {
    if (d.tokenizer_json.empty()) return;
    ckpt::atomic_write((fs::path(run_dir) / kTokenizerFile).string(), d.tokenizer_json.data(),
                       d.tokenizer_json.size());
}

}  // namespace

TrainSummary run_training(const core::Config& c, bool overwrite, comm::ProcessGroup* world) {
    const std::string run_dir = c.get_string("run.dir");
    validate_layout(c);
    std::unique_ptr<comm::DeviceMesh> mesh;
    comm::ProcessGroup* dp = data_parallel_group(c, world, mesh);
    const bool first = !world || world->rank() == 0;
    check_new_run_dir(run_dir, overwrite);
    // Another process may be training in an existing directory: refuse
    // before doing any work. A new one is locked when it is created.
    std::optional<RunDirLock> lock;
    if (first && fs::exists(run_dir)) lock.emplace(run_dir);
    // Resolves (and prepares) the data, builds loaders, model and optimizer:
    // every error surfaces here, before anything in the run directory is
    // touched.
    const TrainData data = shared_train_data(c, world);
    Trainer trainer(c, data, dp);
    trainer.init_fresh();
    barrier(world);  // every rank has validated before the first one writes
    if (first) {
        if (!lock) lock.emplace(run_dir);
        clear_run_dir(run_dir);
        const std::string text = c.to_toml();
        ckpt::atomic_write((fs::path(run_dir) / "config.toml").string(), text.data(), text.size());
        save_tokenizer(run_dir, data);
    }
    barrier(world);
    return trainer.run(false);
}

TrainSummary resume_training(const core::Config& c, comm::ProcessGroup* world, bool previous_good) {
    const std::string run_dir = c.get_string("run.dir");
    validate_layout(c);
    std::unique_ptr<comm::DeviceMesh> mesh;
    comm::ProcessGroup* dp = data_parallel_group(c, world, mesh);
    const bool first = !world || world->rank() == 0;
    std::optional<RunDirLock> lock;
    if (first && fs::is_directory(run_dir)) lock.emplace(run_dir);
    std::vector<std::string> skipped;
    const CheckpointRef ck = latest_checkpoint(run_dir, previous_good, &skipped);
    if (first) {
        for (const auto& why : skipped) {
            fmt::print(stderr, "apiary: warning: skipping a damaged checkpoint: {}\n", why);
        }
        if (!skipped.empty()) fmt::print(stderr, "apiary: resuming from {}\n", ck.dir);
    }
    const TrainData data = shared_train_data(c, world);
    Trainer trainer(c, data, dp);
    trainer.load(ck);
    barrier(world);
    if (first) {
        // The records of steps after the checkpoint are written again.
        truncate_metrics(run_dir, ck.step);
        // Record the config the run continues with (e.g. a raised train.steps).
        const std::string text = c.to_toml();
        ckpt::atomic_write((fs::path(run_dir) / "config.toml").string(), text.data(), text.size());
        if (!fs::exists(fs::path(run_dir) / kTokenizerFile)) save_tokenizer(run_dir, data);
    }
    return trainer.run(true);
}

}  // namespace apiary::train
