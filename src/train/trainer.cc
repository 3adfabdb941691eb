#include "train/trainer.h"

#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>

#include "ckpt/safetensors.h"
#include "core/allocator.h"
#include "core/error.h"
#include "core/model_spec.h"
#include "core/signals.h"
#include "core/threads.h"
#include "core/trace.h"
#include "data/file_io.h"
#include "data/loader.h"
#include "kernels/kernels.h"
#include "model/model.h"
#include "obs/observer.h"
#include "parallel/engine.h"
#include "parallel/layout.h"
#include "plan/totals.h"
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

// Everything that can be wrong with the config alone, checked before any
// file is touched or any large buffer allocated. The layout is checked
// against the model (parallel_layout_from) once the vocabulary is known.
void validate_config(const core::Config& c, int world_size) {
    // Keys the planner models but the trainer cannot train (yet).
    for (const char* axis : {"parallel.cp", "parallel.ep"}) {
        if (c.get_int(axis) != 1) {
            throw ConfigError(
                fmt::format("{} = {}: context and expert parallelism are modelled by "
                            "`apiary plan` only; the trainer needs it to be 1",
                            axis, c.get_int(axis)));
        }
    }
    if (c.get_string("train.precision") == "fp8") {
        throw ConfigError(
            "train.precision = 'fp8' is modelled by `apiary plan` only; the trainer "
            "trains in fp32, bf16 or fp16");
    }
    const core::ModelSpec spec = core::model_spec_from(c);
    if (const std::string what = spec.trainer_unsupported(); !what.empty()) {
        throw ConfigError(
            fmt::format("{}: `apiary plan` models it, the trainer does not train it; "
                        "leave it unset for apiary train",
                        what));
    }
    spec.validate();
    parallel::parallel_layout_from(c, spec, world_size);
    if (const std::string freeze = c.get_string("train.freeze"); !freeze.empty()) {
        // A prefix that names no parameter is a typo that would silently
        // train everything: the whole model's names (the registry alone).
        model::ModelOptions o;
        o.storage = model::Storage::sharded;
        const model::Transformer m(spec, 1, 1, o);
        std::stringstream ss(freeze);
        for (std::string prefix; std::getline(ss, prefix, ',');) {
            if (prefix.empty()) continue;
            bool any = false;
            for (const auto& e : m.registry().entries()) any |= e.name.rfind(prefix, 0) == 0;
            if (!any) {
                throw ConfigError(fmt::format(
                    "train.freeze: '{}' is the prefix of no parameter of this model (its "
                    "parameters are named like '{}' and '{}'; `apiary ckpt inspect` lists them)",
                    prefix, m.registry().entries().front().name, m.registry().entries()[1].name));
            }
        }
    }
    if (c.get_int("parallel.zero_stage") == 3 && c.get_string("train.precision") == "fp16") {
        throw ConfigError(
            "parallel.zero_stage = 3 with train.precision = 'fp16': sharded parameters take fp32 "
            "or bf16 (the emulated fp16 weight copy is made for the whole model at once); use "
            "stage 2 or bf16");
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

// The model the config describes, with the tokenizer's vocabulary.
core::ModelSpec resolve_spec(const core::Config& c, const TrainData& data) {
    core::ModelSpec spec = core::model_spec_from(c);
    // The vocabulary is the tokenizer's; a larger model.vocab_size pads it
    // (rows no token uses), a smaller one cannot hold its ids.
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
    return spec;
}

parallel::EngineOptions engine_options(const core::Config& c) {
    parallel::EngineOptions o;
    o.precision = model::parse_precision(c.get_string("train.precision"));
    o.adamw = {float(c.get_real("train.beta1")), float(c.get_real("train.beta2")),
               float(c.get_real("train.eps")), float(c.get_real("train.weight_decay")),
               float(c.get_real("train.grad_clip"))};
    o.loss_scaler = {c.get_real("train.loss_scale_init"), 2.0, 0.5,
                     c.get_int("train.loss_scale_growth_interval"),
                     c.get_real("train.loss_scale_min")};
    o.bucket_mb = c.get_real("comm.bucket_mb");
    o.bf16_wire = c.get_string("comm.grad_dtype") == "bf16";
    std::stringstream ss(c.get_string("train.freeze"));
    for (std::string prefix; std::getline(ss, prefix, ',');) {
        if (!prefix.empty()) o.freeze.push_back(prefix);
    }
    return o;
}

SaveOptions save_options(const core::Config& c) {
    SaveOptions o;
    o.keep = c.get_int("train.ckpt_keep");
    o.async = c.get_bool("train.ckpt_async");
    o.incremental = c.get_bool("train.ckpt_incremental");
    o.piece_bytes =
        std::max<int64_t>(4, int64_t(c.get_real("train.ckpt_piece_mb") * 1048576.0) / 4 * 4);
    return o;
}

// One training run: built (and fully validated) by the constructor, driven
// by run(). Resuming is the same object with state loaded before run().
class Trainer {
  public:
    Trainer(const core::Config& c, const TrainData& data, comm::ProcessGroup* world)
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
          layout_(parallel::parallel_layout_from(c, spec_, world ? world->size() : 1)),
          coord_(comm::coord_of(layout_.mesh, world ? world->rank() : 0)),
          threads_(set_threads(c)),
          // Measured before the data is prepared: a first run's tokenizer
          // training and shard writes would otherwise share the cores with
          // the measurement and make MFU read several times too high.
          peak_(precision_ == model::Precision::bf16 ? kernels::measure_gemm_bf16_peak_flops(0.2)
                                                     : kernels::measure_gemm_peak_flops(0.2)),
          train_data_(make_loader("train")),
          val_data_(make_loader("val")),
          val_start_(val_data_->state()),
          schedule_(steps_, c.get_int("train.warmup_steps"), c.get_real("train.lr"),
                    c.get_real("train.min_lr"), c.get_string("train.lr_schedule_by") == "tokens",
                    c.get_int("data.curriculum_start") > 0 ? c.get_int("data.curriculum_steps") : 0,
                    [&](int64_t step) {
                        const auto [b, t] = train_data_->shape_at(step);
                        return b * t * layout_.dp();
                    }),
          engine_(spec_, layout_, world, B_, T_, engine_options(c)),
          saver_(engine_, run_dir_, save_options(c)),
          obs_(std::make_unique<obs::RunObserver>(
              c, world, peak_, [this](const std::string& line) { say("{}", line); })) {
        check_eval_batches();
    }

    void init_fresh() { engine_.init(seed_); }
    // This run is the k-th restart of a supervised job (apiary launch).
    void set_restart(int k) { restart_ = k; }
    // Loads weights, optimizer state, loss scaler and step from a checkpoint.
    void load(const CheckpointRef& ck);
    TrainSummary run(bool append_metrics);

  private:
    static int set_threads(const core::Config& c) {
        core::set_num_threads(int(c.get_int("train.threads")));
        return core::num_threads();
    }
    std::unique_ptr<data::Loader> make_loader(const std::string& split) const {
        auto o = data::LoaderOptions::from_config(c_, coord_.dp, layout_.dp(), split);
        o.sources = data_.sources;
        o.tokenizer_hash = data_.tokenizer_hash;
        if (split == "train") {
            // One loader step is one optimizer step: B * grad_accum windows
            // per data-parallel rank, which the micro-steps take B at a time.
            // The global batch is then the same windows for any dp size with
            // the same dp * B * grad_accum, and the curriculum counts
            // optimizer steps. Tensor- and pipeline-parallel ranks of one
            // data-parallel rank read the same windows.
            o.batch_size *= c_.get_int("train.grad_accum");
        } else {
            o.prefetch = 0;  // read on demand, from the start at every evaluation
        }
        return std::make_unique<data::Loader>(o);
    }
    // The held-out loss over train.eval_batches batches; nullopt when a stop
    // was requested during it (every rank gives up at the same batch).
    std::optional<double> evaluate();
    // train.eval_batches against the distinct batches of the val split.
    void check_eval_batches() const;
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
    void print_banner(double unigram);
    json step_record(int64_t step, const parallel::StepResult& r, double lr);
    // Starts a save (committed at once, or by a later poll when async).
    void save(int64_t step) {
        APIARY_TRACE("checkpoint", core::trace::Kind::checkpoint, -1, -1, nullptr, step);
        if (saver_.poll(true)) note_save(*metrics_);  // the one in flight first
        saver_.save(step, checkpoint_meta(step));
        if (!saver_.in_flight()) note_save(*metrics_);  // a synchronous save, committed
    }
    // Records a committed or failed save in metrics.jsonl, the console and
    // the rank's metrics, and sets the Young/Daly interval after the first
    // save when asked.
    void note_save(std::optional<MetricsLog>& metrics);
    // The next batch to train on, past the skipped ones.
    const data::Batch& next_batch(int64_t step);
    // Loss or gradients that cannot be trained on: non-finite, or a spike.
    std::string bad_step(const parallel::StepResult& r);
    // Back to the latest checkpoint, never to train on `batch` again;
    // returns the step the run continues after.
    int64_t roll_back(int64_t step, int64_t batch, const std::string& why,
                      std::optional<MetricsLog>& metrics);
    obs::StepReport step_report(int64_t step, const parallel::StepResult& r, double lr, double dt,
                                double data_wait, const data::Batch& batch) const;
    bool main_rank() const { return engine_.main_rank(); }
    // The first rank prints; every rank writes the same lines to its own log
    // in the run directory (logs/rank_NNNNN.log), with what it alone knows
    // added by note().
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
        const std::string path =
            (dir / fmt::format("rank_{:05d}.log", engine_.world_rank())).string();
        rank_log_.open(path, append ? std::ios::app : std::ios::trunc);
        if (!rank_log_) throw IoError(fmt::format("{}: cannot open for writing", path));
    }
    json checkpoint_meta(int64_t step) const {
        return {{"tokenizer", data_.tokenizer_json.empty() ? "" : kTokenizerFile},
                {"tokenizer_hash", data_.tokenizer_hash},
                // Where the training stream continues (global, the same on every rank).
                {"loader", train_data_->state()},
                {"config_hash", fmt::format("{:016x}", c_.hash())},
                {"precision", c_.get_string("train.precision")},
                // Positions beyond the trained length were never trained:
                // generation keeps its window within it.
                {"seq_len", T_},
                {"tokens", schedule_.tokens_before(step)},
                {"skipped_batches", skip_batches_},
                {"loss_scaler", engine_.loss_scaler().state()}};
    }

    const core::Config& c_;
    const TrainData& data_;
    core::ModelSpec spec_;
    int64_t B_, T_, accum_, steps_;
    uint64_t seed_;
    std::string run_dir_;
    model::Precision precision_;
    std::set<int64_t> inject_;
    parallel::ParallelLayout layout_;
    comm::MeshCoord coord_;
    int threads_;
    double peak_;  // matmul FLOP/s of one rank in the run's precision
    std::unique_ptr<data::Loader> train_data_, val_data_;
    nlohmann::json val_start_;  // every evaluation reads the same held-out windows
    LrSchedule schedule_;
    parallel::Engine engine_;
    int64_t start_step_ = 0;
    CheckpointSaver saver_;
    // Loader batch numbers (1-based) never trained on: the batches a
    // rollback skipped. Saved in every checkpoint, so a resume skips them.
    std::set<int64_t> skip_batches_;
    int64_t rollbacks_ = 0;
    int restart_ = 0;
    std::optional<MetricsLog>* metrics_ = nullptr;  // run()'s log (the first rank's)
    int64_t ckpt_every_ = 0;  // the Young/Daly interval, with train.ckpt_every_auto
    bool ckpt_interval_logged_ = false;
    double last_step_s_ = 0;
    std::deque<double> recent_losses_;  // for the spike test
    std::ofstream rank_log_;
    std::unique_ptr<obs::RunObserver> obs_;  // metrics, health, traces
};

void Trainer::load(const CheckpointRef& ck) {
    // The data first: a changed tokenizer also changes the model's
    // vocabulary, and should be named as what changed.
    restore_data(ck);
    // The config may change the run's length or logging, not the model.
    const json have = spec_to_json(spec_), saved = ck.meta["model"];
    if (have != saved) {
        throw ConfigError(
            fmt::format("{}: the checkpoint is of model {}, but the config "
                        "describes {}; resume without changing model.*",
                        ck.dir, saved.dump(), have.dump()));
    }
    load_checkpoint(engine_, ck);
    skip_batches_.clear();
    if (ck.meta.contains("skipped_batches")) {
        for (const auto& b : ck.meta["skipped_batches"]) skip_batches_.insert(b.get<int64_t>());
    }
    auto& scaler = engine_.loss_scaler();
    if (ck.meta.contains("loss_scaler")) scaler.restore(ck.meta["loss_scaler"]);
    // Every step either updated the weights or was skipped for overflow.
    if (engine_.optimizer().step_count() != ck.step - scaler.skipped_steps()) {
        throw IoError(
            fmt::format("{}: the optimizer has taken {} steps, but the checkpoint says "
                        "step {} with {} skipped (checkpoint damaged)",
                        ck.dir, engine_.optimizer().step_count(), ck.step, scaler.skipped_steps()));
    }
    start_step_ = ck.step;
    if (start_step_ >= steps_) {
        throw ConfigError(
            fmt::format("{}: the run already reached step {} of train.steps = {}; "
                        "raise it with --set train.steps=N to train further",
                        run_dir_, start_step_, steps_));
    }
}

const data::Batch& Trainer::next_batch(int64_t step) {
    for (;;) {
        const data::Batch& b = train_data_->next_batch();
        APIARY_CHECK(b.step >= step && b.B % accum_ == 0,
                     "loader batch of step {} with {} rows at step {}, grad_accum {}", b.step, b.B,
                     step, accum_);
        if (!skip_batches_.count(b.step + 1)) return b;
        note(fmt::format("step {}: batch {} skipped (a rollback left it out)", step + 1,
                         b.step + 1));
    }
}

std::string Trainer::bad_step(const parallel::StepResult& r) {
    const double loss = r.loss();
    if (!std::isfinite(loss)) return fmt::format("the loss is {}", loss);
    if (!std::isfinite(r.grad_norm) && !engine_.loss_scaler().enabled()) {
        return fmt::format("the gradient norm is {}", r.grad_norm);
    }
    const double z_limit = c_.get_real("train.spike_zscore");
    const size_t window = size_t(c_.get_int("train.spike_window"));
    std::string why;
    if (z_limit > 0 && recent_losses_.size() >= std::max<size_t>(2, window / 2)) {
        double mean = 0, var = 0;
        for (double l : recent_losses_) mean += l;
        mean /= double(recent_losses_.size());
        for (double l : recent_losses_) var += (l - mean) * (l - mean);
        const double sd = std::sqrt(var / double(recent_losses_.size() - 1));
        const double z = sd > 0 ? (loss - mean) / sd : 0.0;
        if (z > z_limit) {
            why = fmt::format(
                "the loss {:.4f} is {:.1f} standard deviations above the mean "
                "{:.4f} of the last {} steps (train.spike_zscore = {})",
                loss, z, mean, recent_losses_.size(), z_limit);
        }
    }
    if (why.empty()) {
        recent_losses_.push_back(loss);
        if (recent_losses_.size() > window) recent_losses_.pop_front();
    }
    return why;
}

int64_t Trainer::roll_back(int64_t step, int64_t batch, const std::string& why,
                           std::optional<MetricsLog>& metrics) {
    if (++rollbacks_ > c_.get_int("train.max_rollbacks")) {
        throw Error(
            fmt::format("step {}: {}; {} rollbacks already (train.max_rollbacks): the "
                        "run is unstable; lower train.lr or inspect the data",
                        step + 1, why, rollbacks_ - 1));
    }
    saver_.poll(true);
    const std::vector<std::pair<int64_t, std::string>> saved = list_checkpoints(run_dir_);
    if (saved.empty()) {
        throw Error(
            fmt::format("step {}: {}; there is no checkpoint to roll back to (set "
                        "train.ckpt_every)",
                        step + 1, why));
    }
    const CheckpointRef ck = latest_checkpoint(run_dir_);
    skip_batches_.insert(batch);
    say("\nstep {}: {}: rolling back to step {} and skipping batch {}\n", step + 1, why, ck.step,
        batch);
    const std::set<int64_t> skips = skip_batches_;
    load(ck);
    skip_batches_.insert(skips.begin(), skips.end());
    recent_losses_.clear();
    if (metrics) {
        // Records after the checkpoint are written again by the replayed steps.
        const std::string path = metrics->path();
        metrics.reset();
        truncate_metrics(run_dir_, ck.step);
        metrics.emplace(path, true);
        metrics->write({{"step", ck.step},
                        {"event", "rollback"},
                        {"at_step", step + 1},
                        {"skipped_batch", batch},
                        {"reason", why}});
    }
    return ck.step;
}

void Trainer::note_save(std::optional<MetricsLog>& metrics) {
    const SaveStats& st = saver_.last();
    if (st.step < 0) return;
    if (st.error.empty()) obs_->checkpoint_done(st.total_s, st.stall_s, double(st.bytes_written));
    if (metrics) {
        json rec = {{"step", st.step},
                    {"event", "checkpoint"},
                    {"stall_s", st.stall_s},
                    {"save_s", st.total_s},
                    {"bytes_written", st.bytes_written},
                    {"bytes_reused", st.bytes_reused}};
        if (!st.error.empty()) rec["error"] = st.error;
        metrics->write(rec);
    }
    const double mtbf_h = c_.get_real("train.ckpt_mtbf_hours");
    if (mtbf_h <= 0 || !st.error.empty() || ckpt_interval_logged_) return;
    ckpt_interval_logged_ = true;
    // Young/Daly: the interval that loses least to saves and to failures,
    // from what this save stalled training for.
    const double cost = std::max(st.stall_s, 1e-3);
    const double interval_s = plan::daly_interval_s(cost, mtbf_h * 3600.0);
    const double step_s = std::max(1e-6, last_step_s_);
    const int64_t every = std::max<int64_t>(1, int64_t(interval_s / step_s + 0.5));
    say("{}checkpoint cost {:.3f} s, MTBF {} h: the Young/Daly interval is {:.0f} s = {} steps{}\n",
        ::isatty(STDOUT_FILENO) ? "\r\033[K" : "", cost, mtbf_h, interval_s, every,
        c_.get_bool("train.ckpt_every_auto") ? " (used from now on)" : "");
    if (c_.get_bool("train.ckpt_every_auto")) ckpt_every_ = every;
}

namespace {

// Whether some rank asked to stop, decided between evaluation batches with no
// wait of its own: the vote cast before batch i is reduced while batch i
// computes and read before batch i + 1. Every rank reads the same sum at the
// same batch (a signal reaches the ranks at different moments), so they all
// leave together; the price is one batch of delay. One rank asks itself.
class StopVote {
  public:
    explicit StopVote(comm::ProcessGroup* world)
        : world_(world && world->size() > 1 ? world : nullptr) {}
    ~StopVote() {
        // Left by an error in the evaluation: peers may never join the call,
        // so it is not waited for, and its 8 bytes are left to it.
        if (pending_) (void)votes_.release();
    }
    StopVote(const StopVote&) = delete;
    StopVote& operator=(const StopVote&) = delete;

    // True on every rank at the same call once any rank has asked to stop.
    bool stop_agreed() {
        if (!world_) return core::stop_requested();
        if (pending_) {
            finish();
            if (*votes_ > 0) return true;
        }
        *votes_ = core::stop_requested() ? 1 : 0;
        pending_ = world_->all_reduce(votes_.get(), 1, core::DType::i64, comm::ReduceOp::sum,
                                      {"eval_stop", 0});
        return false;
    }
    // Completes the vote in flight (every rank has issued it).
    void finish() {
        if (!pending_) return;
        pending_->wait();
        pending_.reset();
    }

  private:
    comm::ProcessGroup* world_;
    std::unique_ptr<int64_t> votes_ = std::make_unique<int64_t>(0);
    comm::WorkHandle pending_;
};

}  // namespace

std::optional<double> Trainer::evaluate() {
    APIARY_TRACE("eval", core::trace::Kind::eval);
    model::LossResult local;
    val_data_->restore(val_start_);
    StopVote vote(engine_.world());
    for (int64_t i = 0; i < c_.get_int("train.eval_batches"); ++i) {
        if (vote.stop_agreed()) return std::nullopt;
        const data::Batch& b = val_data_->next_batch();
        const auto r = engine_.evaluate(b.tokens.data(), b.B, b.T);
        local.loss_sum += r.loss_sum;
        local.count += r.count;
    }
    // A stop asked during the last batch is taken by the next step's vote.
    vote.finish();
    const double loss = engine_.sum_over_world(local.loss_sum);
    const int64_t count = engine_.sum_over_world(local.count);
    return loss / double(std::max<int64_t>(1, count));
}

void Trainer::check_eval_batches() const {
    // Windows past the split's end come round again: more batches measure
    // the same text and only take longer (with a huge count, ignoring stop
    // signals for hours before evaluations could be cut short).
    uint64_t windows = 0;
    for (size_t s = 0; s < val_data_->num_sources(); ++s)
        windows += val_data_->samples_in_source(s);
    const int64_t per_batch = B_ * layout_.dp();
    const int64_t distinct = std::max<int64_t>(1, int64_t(windows) / per_batch);
    const int64_t asked = c_.get_int("train.eval_batches");
    if (asked <= distinct) return;
    throw ConfigError(fmt::format(
        "train.eval_batches = {}: the held-out (val) split of {} has {} windows of {} tokens, "
        "{} distinct batches of {} windows (train.batch_size {} x {} data-parallel ranks); set "
        "train.eval_batches to at most {}, or hold out more text (data.val_fraction)",
        asked,
        c_.get_string("data.sources").empty() ? c_.get_string("data.corpus")
                                              : c_.get_string("data.sources"),
        windows, T_ + 1, distinct, per_batch, B_, layout_.dp(), distinct));
}

void Trainer::restore_data(const CheckpointRef& ck) {
    const std::string where = ck.dir;
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
    // Each skipped batch the loader has passed is one batch more than steps.
    int64_t skipped = 0;
    if (ck.meta.contains("skipped_batches") && ck.meta["skipped_batches"].is_array()) {
        for (const auto& b : ck.meta["skipped_batches"]) {
            if (b.is_number_integer() && b.get<int64_t>() <= train_data_->step()) ++skipped;
        }
    }
    if (train_data_->step() != ck.step + skipped) {
        throw IoError(
            fmt::format("{}: the loader state is at batch {}, the checkpoint at step {} "
                        "with {} batches skipped (checkpoint damaged)",
                        where, train_data_->step(), ck.step, skipped));
    }
}

void Trainer::print_banner(double unigram) {
    say("apiary train: {} model, {:.2f}M parameters, {} layers, C={}, V={}, {}\n",
        core::arch_name(spec_.arch), double(spec_.num_params()) / 1e6, spec_.n_layer, spec_.n_embd,
        spec_.vocab_size, c_.get_string("train.precision"));
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
    say("  {} steps x {} tokens (B={} T={} accum={}), {} threads/rank, matmul peak {:.0f} "
        "GFLOP/s/rank\n",
        steps_, B_ * T_ * accum_ * layout_.dp(), B_, T_, accum_, threads_, peak_ / 1e9);
    if (engine_.world_size() > 1) say("  layout {}\n", layout_.describe());
    say("  run directory {}{}\n", run_dir_,
        start_step_ ? fmt::format(", resuming after step {}", start_step_) : "");
    std::fflush(stdout);
}

json Trainer::step_record(int64_t step, const parallel::StepResult& r, double lr) {
    const auto& t = engine_.times();
    json rec = {{"grad_norm", r.grad_norm},           {"lr", lr},
                {"world_size", engine_.world_size()}, {"tokens", schedule_.tokens_before(step + 1)},
                {"step_compute_s", t.compute},        {"optimizer_s", t.optimizer}};
    auto& scaler = engine_.loss_scaler();
    if (scaler.enabled()) {
        rec["loss_scale"] = scaler.scale();
        rec["skipped_steps"] = scaler.skipped_steps();
        rec["overflows"] = scaler.overflows();
    }
    if (layout_.dp() > 1) {
        rec["comm_exposed_s"] = t.dp_exposed;
        rec["dp_reductions"] = engine_.dp_reductions();
        rec["dp_reductions_in_backward"] = engine_.dp_reductions_in_backward();
    }
    if (layout_.tp() > 1) {
        rec["tp_comm_s"] = t.tp_comm;
        rec["tp_comm_bytes"] = engine_.tp_bytes();
    }
    if (layout_.pp() > 1) {
        rec["pp_wait_s"] = t.pp_wait;
        rec["pp_bytes"] = engine_.pp_bytes();
        rec["bubble"] = t.bubble();
    }
    return rec;
}

obs::StepReport Trainer::step_report(int64_t step, const parallel::StepResult& r, double lr,
                                     double dt, double data_wait, const data::Batch& batch) const {
    const auto& t = engine_.times();
    const auto& scaler = engine_.loss_scaler();
    obs::StepReport o;
    o.step = step + 1;
    o.loss = r.loss();
    o.lr = lr;
    o.grad_norm = r.grad_norm;
    o.loss_scale = scaler.enabled() ? scaler.scale() : 1.0;
    o.skipped_steps = scaler.skipped_steps();
    o.step_s = dt;
    o.data_wait_s = data_wait;
    o.tokens = double(batch.B * batch.T * layout_.dp());
    o.flops = o.tokens * spec_.train_flops_per_token(int(batch.T));
    o.forward_s = t.forward;
    o.backward_s = t.backward;
    o.optimizer_s = t.optimizer;
    o.exposed_comm_s = engine_.exposed_comm_seconds();
    o.busy_max_s = r.busy_max_s;
    o.busy_min_s = r.busy_min_s;
    o.job_health = r.health;
    return o;
}

TrainSummary Trainer::run(bool append_metrics) {
    open_rank_log(append_metrics);
    std::optional<MetricsLog> metrics;
    metrics_ = &metrics;
    if (main_rank()) metrics.emplace((fs::path(run_dir_) / kMetricsFile).string(), append_metrics);
    if (metrics && restart_ > 0) {
        metrics->write({{"step", start_step_},
                        {"event", "restart"},
                        {"restart", restart_},
                        {"world_size", engine_.world_size()},
                        {"layout", layout_.describe()}});
    }
    // The unigram baseline is computed by the first rank only (it prints it).
    const double unigram = main_rank() ? unigram_entropy() : 0.0;
    print_banner(unigram);
    obs_->start(start_step_);

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
    // The loop ends only on a stop every rank agreed on (a signal read
    // directly could reach ranks at different steps).
    bool stop = false;
    for (; step < steps_ && !stop; ++step) {
        obs_->before_step(step);
        APIARY_TRACE("step", core::trace::Kind::step, -1, -1, nullptr, step + 1);
        const auto t0 = Clock::now();
        // This data-parallel rank's windows of the step, (rows, T + 1): B_t
        // rows of T_t per micro-step, which vary under a curriculum.
        const data::Batch& batch = [&]() -> const data::Batch& {
            APIARY_TRACE("data wait", core::trace::Kind::data);
            return next_batch(step);
        }();
        const double data_wait = seconds_since(t0);
        const int64_t batch_number = batch.step + 1;
        const double lr = schedule_.at(step);
        // Testing hook: an overflowing loss scale on the last data-parallel
        // rank only; the reductions carry it to every rank.
        const bool poison = inject_.count(batch_number) && coord_.dp == layout_.dp() - 1;
        engine_.set_rank_signals(obs_->poll_health(), obs_->busy_seconds());
        const parallel::StepResult r = engine_.train_step(batch.tokens.data(), batch.B, batch.T, lr,
                                                          core::stop_requested(), poison);
        stop = r.stop;
        if (c_.get_bool("train.rollback")) {
            if (const std::string why = bad_step(r); !why.empty()) {
                step = roll_back(step, batch_number, why, metrics) - 1;
                window_loss = window_time = window_flops = 0;
                window_steps = window_tokens = 0;
                continue;
            }
        }
        if (!r.applied && !engine_.loss_scaler().enabled()) {
            throw Error(
                fmt::format("non-finite gradients at step {} (norm {}): training "
                            "diverged; lower train.lr (now {}) or raise "
                            "train.warmup_steps",
                            step + 1, r.grad_norm, lr_peak));
        }
        if (!r.applied) {
            say("{}step {}: fp16 gradients overflowed; step skipped, loss scale now {}\n",
                tty ? "\r\033[K" : "", step + 1, engine_.loss_scaler().scale());
        }
        const double dt = seconds_since(t0);
        last_step_s_ = dt;
        const double loss = r.loss();
        if (!std::isfinite(loss)) {
            throw Error(
                fmt::format("training diverged at step {}: loss is {}; lower train.lr "
                            "(now {}) or raise train.warmup_steps",
                            step + 1, loss, lr_peak));
        }
        if (obs_->after_step(step_report(step, r, lr, dt, data_wait, batch)) ==
            obs::AfterStep::stop_unhealthy) {
            stop = true;
            summary.health_stop = obs_->stop_reason();
        }
        const int64_t tokens = batch.B * batch.T * layout_.dp();
        window_loss += loss;
        window_time += dt;
        window_steps += 1;
        window_tokens += tokens;
        window_flops += double(tokens) * spec_.train_flops_per_token(int(batch.T));
        const bool last = step + 1 == steps_;
        if ((eval_every > 0 && (step + 1) % eval_every == 0) || last) {
            const std::optional<double> eval = evaluate();
            if (!eval) {
                // A stop during the evaluation, agreed by every rank: it is
                // dropped (no record) and the stop checkpoint follows at once.
                stop = true;
                continue;
            }
            last_eval = *eval;
            obs_->eval_done(last_eval);
            if (metrics) metrics->write({{"step", step + 1}, {"eval_loss", last_eval}});
        }
        if ((step + 1) % log_every == 0 || last) {
            const double tps = double(window_tokens) / window_time;
            // Over all ranks' peaks: the world's share of model FLOPs.
            const obs::Mfu mfu = obs::model_flops_utilisation(window_flops, window_time, peak_,
                                                              engine_.world_size());
            const double eta = double(steps_ - step - 1) * window_time / double(window_steps);
            json rec = step_record(step, r, lr);
            rec["step"] = step + 1;
            rec["loss"] = window_loss / double(window_steps);
            rec["step_time_s"] = window_time / double(window_steps);
            rec["tokens_per_s"] = tps;
            rec["mfu"] = mfu.value;
            if (mfu.capped) rec["mfu_capped"] = true;
            rec["elapsed_s"] = seconds_since(t_start);
            // Which tokens the step trained on (this rank's windows): runs
            // that must see the same data compare these.
            rec["batch_xxh64"] = data::hex64(
                data::xxhash64(batch.tokens.data(), batch.tokens.size() * sizeof(int32_t)));
            if (metrics) metrics->write(rec);
            if (engine_.world_size() > 1) {
                const auto& t = engine_.times();
                note(
                    fmt::format("rank {} (dp {} tp {} pp {}): step {} took {:.3f} s: compute "
                                "{:.3f}, waiting on gradients {:.3f}, tensor-parallel "
                                "{:.3f}, pipeline {:.3f}, optimizer {:.3f}",
                                engine_.world_rank(), coord_.dp, coord_.tp, coord_.pp, step + 1, dt,
                                t.compute, t.dp_exposed, t.tp_comm, t.pp_wait, t.optimizer));
            }
            const std::string eval_part =
                std::isnan(last_eval) ? "" : fmt::format(" | val {:.4f}", last_eval);
            auto& scaler = engine_.loss_scaler();
            const std::string scale_part =
                scaler.enabled() ? fmt::format(" | scale {:g}", scaler.scale()) : "";
            // Above 100%, the peak measured at start was low (the cores were
            // busier then): capped, and said so.
            const std::string mfu_part =
                mfu.capped ? "MFU 100% (capped: the matmul peak measured at start was low)"
                           : fmt::format("MFU {:.1f}%", 100.0 * mfu.value);
            say("{}step {:>{}}/{} | loss {:.4f}{} | lr {:.2e}{} | {} tok/s | {} | ETA {}{}",
                tty ? "\r\033[K" : "", step + 1, int(std::to_string(steps_).size()), steps_,
                window_loss / double(window_steps), eval_part, lr, scale_part, format_rate(tps),
                mfu_part, format_duration(eta), tty && !last ? "" : "\n");
            std::fflush(stdout);
            summary.final_train_loss = window_loss / double(window_steps);
            summary.tokens_per_s = tps;
            window_loss = window_time = window_flops = 0;
            window_steps = window_tokens = 0;
        }
        const int64_t every = ckpt_every_ > 0 ? ckpt_every_ : ckpt_every;
        if (every > 0 && (step + 1) % every == 0 && !last) save(step + 1);
        if (saver_.poll(false)) note_save(metrics);
    }
    if (stop && !summary.health_stop.empty()) {
        say("\nstopping after step {} for health ({}): saving a checkpoint (move the job, then "
            "`apiary train --resume {}`)\n",
            step, summary.health_stop, run_dir_);
        last_eval = evaluate().value_or(last_eval);
    } else if (stop) {
        // A stop signal asks for the checkpoint now: no evaluation first
        // (the loss reported is the last one measured, if any).
        say("\ninterrupted after step {}: saving a checkpoint (resume with `apiary train "
            "--resume {}`)\n",
            step, run_dir_);
    }
    summary.steps = step;
    summary.interrupted = stop;
    summary.final_eval_loss = last_eval;
    summary.skipped_steps = engine_.loss_scaler().skipped_steps();
    summary.loss_scale = engine_.loss_scaler().scale();
    save(step);
    if (saver_.poll(true)) note_save(metrics);
    if (!saver_.last().error.empty()) {
        throw IoError(
            fmt::format("the final checkpoint (step {}) failed: {}; the latest intact "
                        "one is still in {}/ckpt",
                        step, saver_.last().error, run_dir_));
    }
    summary.checkpoint_dir = saver_.last().dir;
    const auto mem = core::mem_stats();
    if (metrics) {
        json peak_bytes;
        for (int k = 0; k < core::kNumMemCategories; ++k) {
            peak_bytes[core::category_name(core::MemCategory(k))] = mem.peak[k];
        }
        // The ZeRO closed form next to the accounting (params + grads +
        // optimizer), per rank.
        metrics->write(
            {{"step", step},
             {"memory_peak_bytes_per_rank", peak_bytes},
             {"model_state_formula_bytes",
              parallel::model_state_formula(engine_.model(), engine_.zero_stage(), layout_.dp())}});
    }
    // Bits per byte compare runs of different tokenizers on the same text.
    const std::string per_byte =
        data_.bytes_per_token > 0
            ? fmt::format(", {:.3f} bits/byte", last_eval / std::log(2.0) / data_.bytes_per_token)
            : "";
    const std::string val_part =
        std::isnan(last_eval) ? "val loss not measured (stopped before an evaluation finished)"
                              : fmt::format("val loss {:.4f} nats/token{}", last_eval, per_byte);
    say("done: {} steps in {}, {} (unigram {:.4f}), peak memory {:.1f} MiB; checkpoint {}\n", step,
        format_duration(seconds_since(t_start)), val_part, summary.unigram_loss,
        double(mem.total_peak) / 1048576.0, summary.checkpoint_dir);
    obs_->finish();
    if (metrics && metrics->lost() > 0) {
        fmt::print(stderr,
                   "apiary: warning: {} records could not be written to {} (see the warnings "
                   "above); the checkpoint is complete\n",
                   metrics->lost(), metrics->path());
    }
    return summary;
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

// train.elastic: a checkpoint saved by more (or fewer) data-parallel ranks
// continues with the same global batch, its micro-steps scaled. The run's
// config.toml records the scaled value (resume_training), so that the next
// rescale starts from what the run really did.
core::Config elastic_config(const core::Config& c, const CheckpointRef& ck, int world_size) {
    if (!c.get_bool("train.elastic") || !ck.meta.contains("layout")) return c;
    const int64_t saved_dp = ck.meta["layout"].value("dp", int64_t(1));
    const comm::MeshShape mesh = comm::mesh_shape_from(c, world_size);
    const int64_t accum = c.get_int("train.grad_accum");
    if (saved_dp == mesh.dp) return c;
    if ((saved_dp * accum) % mesh.dp != 0) {
        throw ConfigError(fmt::format(
            "train.elastic: the checkpoint's global batch is {} data-parallel ranks x {} "
            "micro-steps; {} ranks cannot keep it (their count must divide {})",
            saved_dp, accum, mesh.dp, saved_dp * accum));
    }
    core::Config out = c;
    out.set(fmt::format("train.grad_accum={}", saved_dp * accum / mesh.dp));
    return out;
}

// Every rank holds the same config (checked by hash) and the layout fits
// the world; errors here come before any rank allocates.
void check_world(const core::Config& c, comm::ProcessGroup* world) {
    validate_config(c, world ? world->size() : 1);
    if (world && world->size() > 1) comm::check_config_hash(*world, c.hash());
}

}  // namespace

TrainSummary run_training(const core::Config& c, bool overwrite, comm::ProcessGroup* world) {
    const std::string run_dir = c.get_string("run.dir");
    check_world(c, world);
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
    Trainer trainer(c, data, world);
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
    check_world(c, world);
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
    const core::Config adjusted = elastic_config(c, ck, world ? world->size() : 1);
    Trainer trainer(adjusted, data, world);
    if (const char* restart = std::getenv("APIARY_RESTART"))
        trainer.set_restart(std::atoi(restart));
    try {
        trainer.load(ck);
    } catch (const IoError& e) {
        // A chunk whose checksum fails on load: name the way out.
        for (const auto& [s, older] : list_checkpoints(run_dir)) {
            if (s >= ck.step) continue;
            try {
                open_checkpoint(older);
            } catch (const IoError&) {
                continue;
            }
            throw IoError(
                fmt::format("{}\nthe checkpoint is damaged; {} (step {}) is intact: "
                            "continue from it with `apiary train --resume {} "
                            "--resume-from-previous-good`",
                            e.what(), older, s, run_dir));
        }
        throw;
    }
    barrier(world);
    if (first) {
        // The records of steps after the checkpoint are written again.
        truncate_metrics(run_dir, ck.step);
        // Record the config the run continues with (e.g. a raised
        // train.steps, or micro-steps rescaled by train.elastic).
        const std::string text = adjusted.to_toml();
        ckpt::atomic_write((fs::path(run_dir) / "config.toml").string(), text.data(), text.size());
        if (!fs::exists(fs::path(run_dir) / kTokenizerFile)) save_tokenizer(run_dir, data);
    }
    return trainer.run(true);
}

}  // namespace apiary::train
