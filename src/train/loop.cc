#include "train/loop.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "core/allocator.h"
#include "core/error.h"
#include "core/signals.h"
#include "core/threads.h"
#include "core/timing.h"
#include "core/trace.h"
#include "data/file_io.h"
#include "kernels/kernels.h"
#include "plan/totals.h"
#include "train/moe_metrics.h"

namespace apiary::train {

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

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

// A terminal rewrites the progress line in place; a file gets every line.
const char* line_start() { return ::isatty(STDOUT_FILENO) ? "\r\033[K" : ""; }

// The model the config describes, with the tokenizer's vocabulary.
core::ModelSpec resolve_spec(const core::Config& c, const TrainOptions& o, const TrainData& data) {
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
    if (o.seq_len > spec.max_seq_len) {
        throw ConfigError(
            fmt::format("train.seq_len = {} exceeds the model's max_seq_len = {} "
                        "(raise model.max_seq_len)",
                        o.seq_len, spec.max_seq_len));
    }
    return spec;
}

}  // namespace

// ---- parts ----

void RunLog::open(const std::string& run_dir, int rank, bool append) {
    const fs::path dir = fs::path(run_dir) / "logs";
    fs::create_directories(dir);
    const std::string path = (dir / fmt::format("rank_{:05d}.log", rank)).string();
    file_.open(path, append ? std::ios::app : std::ios::trunc);
    if (!file_) throw IoError(fmt::format("{}: cannot open for writing", path));
}

void RunLog::say(const std::string& text) {
    if (main_) fmt::print("{}", text);
    note(text);
}

void RunLog::note(std::string text) {
    if (!file_.is_open()) return;
    // Terminal line rewrites ("\r\033[K") are for the console only.
    for (size_t at; (at = text.find("\r\033[K")) != std::string::npos;) text.erase(at, 4);
    if (text.empty()) return;
    file_ << text;
    if (text.back() != '\n') file_ << '\n';
    file_.flush();
}

std::string SpikeCheck::check(double loss) {
    std::string why;
    if (z_limit_ > 0 && recent_.size() >= std::max<size_t>(2, window_ / 2)) {
        double mean = 0, var = 0;
        for (double l : recent_) mean += l;
        mean /= double(recent_.size());
        for (double l : recent_) var += (l - mean) * (l - mean);
        const double sd = std::sqrt(var / double(recent_.size() - 1));
        const double z = sd > 0 ? (loss - mean) / sd : 0.0;
        if (z > z_limit_) {
            why = fmt::format(
                "the loss {:.4f} is {:.1f} standard deviations above the mean "
                "{:.4f} of the last {} steps (train.spike_zscore = {})",
                loss, z, mean, recent_.size(), z_limit_);
        }
    }
    if (why.empty()) {
        recent_.push_back(loss);
        if (recent_.size() > window_) recent_.pop_front();
    }
    return why;
}

// ---- the trainer ----

double Trainer::measure_peak(const TrainOptions& o) {
    core::set_num_threads(int(o.threads));
    return o.precision == model::Precision::bf16 ? kernels::measure_gemm_bf16_peak_flops(0.2)
                                                 : kernels::measure_gemm_peak_flops(0.2);
}

Trainer::Trainer(const core::Config& c, const TrainOptions& o, const TrainData& data,
                 comm::ProcessGroup* world, double peak_flops)
    : c_(c),
      o_(o),
      data_(data),
      spec_(resolve_spec(c, o, data)),
      layout_(parallel::parallel_layout_from(c, spec_, world ? world->size() : 1)),
      coord_(comm::coord_of(layout_.mesh, world ? world->rank() : 0)),
      peak_(peak_flops),
      train_data_(make_loader("train")),
      val_data_(make_loader("val")),
      val_start_(val_data_->state()),
      schedule_(o.steps, o.warmup_steps, o.lr, o.min_lr, o.lr_by_tokens,
                o.curriculum_growth_steps(),
                [this](int64_t step) {
                    const auto [b, t] = train_data_->shape_at(step);
                    return b * t * layout_.dp();
                }),
      engine_(spec_, layout_, world, o.batch_size, o.seq_len, o.engine),
      saver_(engine_, o.run_dir, o.save),
      log_(engine_.main_rank()),
      obs_(std::make_unique<obs::RunObserver>(
          c, world, peak_, [this](const std::string& line) { log_.say(line); })),
      spikes_(o.spike_zscore, o.spike_window) {
    check_eval_batches();
}

std::unique_ptr<data::Loader> Trainer::make_loader(const std::string& split) const {
    auto lo = data::LoaderOptions::from_config(c_, coord_.dp, layout_.dp(), split);
    lo.sources = data_.sources;
    lo.tokenizer_hash = data_.tokenizer_hash;
    if (split == "train") {
        // One loader step is one optimizer step: B * grad_accum windows
        // per data-parallel rank, which the micro-steps take B at a time.
        // The global batch is then the same windows for any dp size with
        // the same dp * B * grad_accum, and the curriculum counts
        // optimizer steps. Tensor- and pipeline-parallel ranks of one
        // data-parallel rank read the same windows.
        lo.batch_size *= o_.grad_accum;
    } else {
        lo.prefetch = 0;  // read on demand, from the start at every evaluation
    }
    return std::make_unique<data::Loader>(lo);
}

// Entropy (nats) of the training stream's unigram distribution: the loss of
// the best model that ignores context (from up to 16M tokens per source).
double Trainer::unigram_entropy() const {
    double h = 0;
    for (double p : train_data_->unigram(uint64_t(16) << 20)) {
        if (p > 0) h -= p * std::log(p);
    }
    return h;
}

TrainSummary Trainer::run(bool append_metrics) {
    begin(append_metrics);
    int64_t step = start_step_;
    // The loop ends only on a stop every rank agreed on (a signal read
    // directly could reach ranks at different steps).
    bool stop = false;
    while (step < o_.steps && !stop) {
        const StepOutcome s = train_one(step);
        stop = s.result.stop;
        if (const std::optional<int64_t> back = maybe_roll_back(step, s)) {
            step = *back;
            window_.reset();
            continue;
        }
        if (check_step(step, s)) stop = true;
        const int64_t tokens = s.batch->B * s.batch->T * layout_.dp();
        window_.add(s.result.loss(), s.dt, tokens,
                    double(tokens) * spec_.train_flops_per_token(int(s.batch->T)));
        const bool last = step + 1 == o_.steps;
        if (!maybe_evaluate(step + 1, last)) {
            // A stop during the evaluation, agreed by every rank: it is
            // dropped (no record) and the stop checkpoint follows at once.
            stop = true;
            ++step;
            continue;
        }
        maybe_log(step + 1, s, last);
        maybe_checkpoint(step + 1, last);
        ++step;
    }
    return finish(step, stop);
}

void Trainer::begin(bool append_metrics) {
    log_.open(o_.run_dir, engine_.world_rank(), append_metrics);
    if (main_rank()) metrics_.emplace((fs::path(o_.run_dir) / kMetricsFile).string(), append_metrics);
    if (restart_ > 0) {
        write_metrics({{"step", start_step_},
                       {"event", "restart"},
                       {"restart", restart_},
                       {"world_size", engine_.world_size()},
                       {"layout", layout_.describe()}});
    }
    // The unigram baseline is computed by the first rank only (it prints it).
    summary_ = TrainSummary{};
    summary_.unigram_loss = main_rank() ? unigram_entropy() : 0.0;
    print_banner(summary_.unigram_loss);
    obs_->start(start_step_);
    t_start_ = Clock::now();
}

StepOutcome Trainer::train_one(int64_t step) {
    obs_->before_step(step);
    APIARY_TRACE("step", core::trace::Kind::step, -1, -1, nullptr, step + 1);
    const auto t0 = Clock::now();
    StepOutcome s;
    // This data-parallel rank's windows of the step, (rows, T + 1): B_t rows
    // of T_t per micro-step, which vary under a curriculum.
    {
        APIARY_TRACE("data wait", core::trace::Kind::data);
        s.batch = &next_batch(step);
    }
    s.data_wait = core::seconds_since(t0);
    s.batch_number = s.batch->step + 1;
    s.lr = schedule_.at(step);
    // Testing hook: an overflowing loss scale on the last data-parallel rank
    // only; the reductions carry it to every rank.
    const bool poison =
        o_.inject_overflow_steps.count(s.batch_number) && coord_.dp == layout_.dp() - 1;
    engine_.set_rank_signals(obs_->poll_health(), obs_->busy_seconds());
    s.result = engine_.train_step(s.batch->tokens.data(), s.batch->B, s.batch->T, s.lr,
                                  core::stop_requested(), poison);
    s.dt = core::seconds_since(t0);
    return s;
}

std::optional<int64_t> Trainer::maybe_roll_back(int64_t step, const StepOutcome& s) {
    if (!o_.rollback) return std::nullopt;
    const std::string why = bad_step(s.result);
    if (why.empty()) return std::nullopt;
    return roll_back(step, s.batch_number, why);
}

bool Trainer::check_step(int64_t step, const StepOutcome& s) {
    const parallel::StepResult& r = s.result;
    if (!r.applied && !engine_.loss_scaler().enabled()) {
        throw Error(
            fmt::format("non-finite gradients at step {} (norm {}): training "
                        "diverged; lower train.lr (now {}) or raise "
                        "train.warmup_steps",
                        step + 1, r.grad_norm, o_.lr));
    }
    if (!r.applied) {
        say("{}step {}: fp16 gradients overflowed; step skipped, loss scale now {}\n",
            line_start(), step + 1, engine_.loss_scaler().scale());
    }
    last_step_s_ = s.dt;
    if (!std::isfinite(r.loss())) {
        throw Error(
            fmt::format("training diverged at step {}: loss is {}; lower train.lr "
                        "(now {}) or raise train.warmup_steps",
                        step + 1, r.loss(), o_.lr));
    }
    if (obs_->after_step(step_report(step, s)) == obs::AfterStep::stop_unhealthy) {
        summary_.health_stop = obs_->stop_reason();
        return true;
    }
    return false;
}

bool Trainer::maybe_evaluate(int64_t done, bool last) {
    if (!last && !(o_.eval_every > 0 && done % o_.eval_every == 0)) return true;
    const std::optional<double> eval = evaluate();
    if (!eval) return false;
    last_eval_ = *eval;
    obs_->eval_done(last_eval_);
    write_metrics({{"step", done}, {"eval_loss", last_eval_}});
    return true;
}

void Trainer::maybe_log(int64_t done, const StepOutcome& s, bool last) {
    if (done % o_.log_every != 0 && !last) return;
    const double tps = window_.tokens_per_s();
    // Over all ranks' peaks: the world's share of model FLOPs.
    const obs::Mfu mfu =
        obs::model_flops_utilisation(window_.flops, window_.time_s, peak_, engine_.world_size());
    const double eta = double(o_.steps - done) * window_.step_time();
    json rec = step_record(done - 1, s.result, s.lr);
    rec["step"] = done;
    rec["loss"] = window_.mean_loss();
    rec["step_time_s"] = window_.step_time();
    rec["tokens_per_s"] = tps;
    rec["mfu"] = mfu.value;
    if (mfu.capped) rec["mfu_capped"] = true;
    rec["elapsed_s"] = core::seconds_since(t_start_);
    // Which tokens the step trained on (this rank's windows): runs that
    // must see the same data compare these.
    rec["batch_xxh64"] = data::hex64(
        data::xxhash64(s.batch->tokens.data(), s.batch->tokens.size() * sizeof(int32_t)));
    if (engine_.model().spec().moe()) {
        std::vector<obs::MoeLoad> load;
        rec["moe"] = moe_load_record(engine_, &load);  // collective
        obs_->moe_load(std::move(load));
    }
    write_metrics(rec);
    if (engine_.world_size() > 1) {
        const auto& t = engine_.times();
        log_.note(fmt::format(
            "rank {} (dp {} tp {} pp {}): step {} took {:.3f} s: compute {:.3f}, waiting on "
            "gradients {:.3f}, tensor-parallel {:.3f}, expert all-to-all {:.3f}, pipeline {:.3f}, "
            "optimizer {:.3f}",
            engine_.world_rank(), coord_.dp, coord_.tp, coord_.pp, done, s.dt, t.compute,
            t.dp_exposed, t.tp_comm, t.ep_comm, t.pp_wait, t.optimizer));
    }
    const std::string eval_part =
        std::isnan(last_eval_) ? "" : fmt::format(" | val {:.4f}", last_eval_);
    const auto& scaler = engine_.loss_scaler();
    const std::string scale_part =
        scaler.enabled() ? fmt::format(" | scale {:g}", scaler.scale()) : "";
    // Above 100%, the peak measured at start was low (the cores were busier
    // then): capped, and said so.
    const std::string mfu_part =
        mfu.capped ? "MFU 100% (capped: the matmul peak measured at start was low)"
                   : fmt::format("MFU {:.1f}%", 100.0 * mfu.value);
    const bool tty = ::isatty(STDOUT_FILENO);
    say("{}step {:>{}}/{} | loss {:.4f}{} | lr {:.2e}{} | {} tok/s | {} | ETA {}{}", line_start(),
        done, int(std::to_string(o_.steps).size()), o_.steps, window_.mean_loss(), eval_part, s.lr,
        scale_part, format_rate(tps), mfu_part, format_duration(eta), tty && !last ? "" : "\n");
    std::fflush(stdout);
    summary_.final_train_loss = window_.mean_loss();
    summary_.tokens_per_s = tps;
    window_.reset();
}

void Trainer::maybe_checkpoint(int64_t done, bool last) {
    const int64_t every = ckpt_every_ > 0 ? ckpt_every_ : o_.ckpt_every;
    if (every > 0 && done % every == 0 && !last) save(done);
    if (saver_.poll(false)) note_save();
}

TrainSummary Trainer::finish(int64_t step, bool stop) {
    if (stop && !summary_.health_stop.empty()) {
        say("\nstopping after step {} for health ({}): saving a checkpoint (move the job, "
            "then `apiary train --resume {}`)\n",
            step, summary_.health_stop, o_.run_dir);
        last_eval_ = evaluate().value_or(last_eval_);
    } else if (stop) {
        // A stop signal asks for the checkpoint now: no evaluation first
        // (the loss reported is the last one measured, if any).
        say("\ninterrupted after step {}: saving a checkpoint (resume with `apiary train "
            "--resume {}`)\n",
            step, o_.run_dir);
    }
    TrainSummary& summary = summary_;
    summary.steps = step;
    summary.interrupted = stop;
    summary.final_eval_loss = last_eval_;
    summary.skipped_steps = engine_.loss_scaler().skipped_steps();
    summary.loss_scale = engine_.loss_scaler().scale();
    save(step);
    if (saver_.poll(true)) note_save();
    if (!saver_.last().error.empty()) {
        const LatestName kept = read_latest(o_.run_dir);
        throw IoError(fmt::format(
            "the final checkpoint (step {}) failed: {}; {}", step, saver_.last().error,
            kept.problem.empty() ? fmt::format("the latest intact one is still {}", kept.dir)
            : kept.missing       ? std::string("the run has no checkpoint to resume from")
                                 : kept.problem));
    }
    summary.checkpoint_dir = saver_.last().dir;
    const auto mem = core::mem_stats();
    write_memory_record(step, mem);
    // Bits per byte compare runs of different tokenizers on the same text.
    const std::string per_byte =
        data_.bytes_per_token > 0
            ? fmt::format(", {:.3f} bits/byte", last_eval_ / std::log(2.0) / data_.bytes_per_token)
            : "";
    const std::string val_part =
        std::isnan(last_eval_) ? "val loss not measured (stopped before an evaluation finished)"
                               : fmt::format("val loss {:.4f} nats/token{}", last_eval_, per_byte);
    say("done: {} steps in {}, {} (unigram {:.4f}), peak memory {:.1f} MiB; checkpoint {}\n", step,
        format_duration(core::seconds_since(t_start_)), val_part, summary.unigram_loss,
        double(mem.total_peak) / 1048576.0, summary.checkpoint_dir);
    obs_->finish();
    if (metrics_ && metrics_->lost() > 0) {
        fmt::print(stderr,
                   "apiary: warning: {} records could not be written to {} (see the warnings "
                   "above); the checkpoint is complete\n",
                   metrics_->lost(), metrics_->path());
    }
    return summary;
}

void Trainer::write_memory_record(int64_t step, const core::MemStats& mem) {
    json peak_bytes;
    for (int k = 0; k < core::kNumMemCategories; ++k) {
        peak_bytes[core::category_name(core::MemCategory(k))] = mem.peak[k];
    }
    // The ZeRO closed form next to the accounting (params + grads +
    // optimizer), per rank.
    write_metrics(
        {{"step", step},
         {"memory_peak_bytes_per_rank", peak_bytes},
         {"model_state_formula_bytes",
          parallel::model_state_formula(engine_.model(), engine_.zero_stage(), layout_.dp())}});
}

void Trainer::load(const CheckpointRef& ck) {
    // The counters before anything changes: a damaged checkpoint is
    // refused with the trainer as it was.
    check_counters(ck);
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
    if (ck.meta.contains("loss_scaler")) engine_.loss_scaler().restore(ck.meta["loss_scaler"]);
    start_step_ = ck.step;
    if (start_step_ >= o_.steps) {
        throw ConfigError(
            fmt::format("{}: the run already reached step {} of train.steps = {}; "
                        "raise it with --set train.steps=N to train further",
                        o_.run_dir, start_step_, o_.steps));
    }
}

const data::Batch& Trainer::next_batch(int64_t step) {
    for (;;) {
        const data::Batch& b = train_data_->next_batch();
        APIARY_CHECK(b.step >= step && b.B % o_.grad_accum == 0,
                     "loader batch of step {} with {} rows at step {}, grad_accum {}", b.step, b.B,
                     step, o_.grad_accum);
        if (!skip_batches_.count(b.step + 1)) return b;
        log_.note(fmt::format("step {}: batch {} skipped (a rollback left it out)", step + 1,
                         b.step + 1));
    }
}

// Loss or gradients that cannot be trained on: non-finite, or a spike.
std::string Trainer::bad_step(const parallel::StepResult& r) {
    const double loss = r.loss();
    if (!std::isfinite(loss)) return fmt::format("the loss is {}", loss);
    if (!std::isfinite(r.grad_norm) && !engine_.loss_scaler().enabled()) {
        return fmt::format("the gradient norm is {}", r.grad_norm);
    }
    return spikes_.check(loss);
}

// Back to the latest checkpoint, never to train on `batch` again; returns
// the step the run continues after.
int64_t Trainer::roll_back(int64_t step, int64_t batch, const std::string& why) {
    if (++rollbacks_ > o_.max_rollbacks) {
        throw Error(
            fmt::format("step {}: {}; {} rollbacks already (train.max_rollbacks): the "
                        "run is unstable; lower train.lr or inspect the data",
                        step + 1, why, rollbacks_ - 1));
    }
    saver_.poll(true);
    const std::vector<std::pair<int64_t, std::string>> saved = list_checkpoints(o_.run_dir);
    if (saved.empty()) {
        throw Error(
            fmt::format("step {}: {}; there is no checkpoint to roll back to (set "
                        "train.ckpt_every)",
                        step + 1, why));
    }
    const CheckpointRef ck = latest_checkpoint(o_.run_dir);
    skip_batches_.insert(batch);
    say("\nstep {}: {}: rolling back to step {} and skipping batch {}\n", step + 1, why, ck.step,
        batch);
    const std::set<int64_t> skips = skip_batches_;
    load(ck);
    skip_batches_.insert(skips.begin(), skips.end());
    spikes_.clear();
    if (metrics_) {
        // Records after the checkpoint are written again by the replayed steps.
        const std::string path = metrics_->path();
        metrics_.reset();
        truncate_metrics(o_.run_dir, ck.step);
        metrics_.emplace(path, true);
        metrics_->write({{"step", ck.step},
                        {"event", "rollback"},
                        {"at_step", step + 1},
                        {"skipped_batch", batch},
                        {"reason", why}});
    }
    return ck.step;
}

// Records a committed or failed save in metrics.jsonl, the console and the
// rank's metrics, and sets the Young/Daly interval after the first save
// when asked.
void Trainer::note_save() {
    const SaveStats& st = saver_.last();
    if (st.step < 0) return;
    if (st.error.empty()) obs_->checkpoint_done(st.total_s, st.stall_s, double(st.bytes_written));
    {
        json rec = {{"step", st.step},
                    {"event", "checkpoint"},
                    {"stall_s", st.stall_s},
                    {"save_s", st.total_s},
                    {"bytes_written", st.bytes_written},
                    {"bytes_reused", st.bytes_reused}};
        if (!st.error.empty()) rec["error"] = st.error;
        write_metrics(rec);
    }
    const double mtbf_h = o_.ckpt_mtbf_hours;
    if (mtbf_h <= 0 || !st.error.empty() || ckpt_interval_logged_) return;
    ckpt_interval_logged_ = true;
    // Young/Daly: the interval that loses least to saves and to failures,
    // from what this save stalled training for.
    const double cost = std::max(st.stall_s, 1e-3);
    const double interval_s = plan::daly_interval_s(cost, mtbf_h * 3600.0);
    const double step_s = std::max(1e-6, last_step_s_);
    const int64_t every = std::max<int64_t>(1, int64_t(interval_s / step_s + 0.5));
    say("{}checkpoint cost {:.3f} s, MTBF {} h: the Young/Daly interval is {:.0f} s = {} steps{}\n",
        line_start(), cost, mtbf_h, interval_s, every,
        o_.ckpt_every_auto ? " (used from now on)" : "");
    if (o_.ckpt_every_auto) ckpt_every_ = every;
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

// The held-out loss over train.eval_batches batches; nullopt when a stop was
// requested during it (every rank gives up at the same batch).
std::optional<double> Trainer::evaluate() {
    APIARY_TRACE("eval", core::trace::Kind::eval);
    model::LossResult local;
    val_data_->restore(val_start_);
    StopVote vote(&engine_.world());
    for (int64_t i = 0; i < o_.eval_batches; ++i) {
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

// train.eval_batches against the distinct batches of the val split.
void Trainer::check_eval_batches() const {
    // Windows past the split's end come round again: more batches measure
    // the same text and only take longer (with a huge count, ignoring stop
    // signals for hours before evaluations could be cut short).
    uint64_t windows = 0;
    for (size_t s = 0; s < val_data_->num_sources(); ++s)
        windows += val_data_->samples_in_source(s);
    const int64_t per_batch = o_.batch_size * layout_.dp();
    const int64_t distinct = std::max<int64_t>(1, int64_t(windows) / per_batch);
    if (o_.eval_batches <= distinct) return;
    throw ConfigError(fmt::format(
        "train.eval_batches = {}: the held-out (val) split of {} has {} windows of {} tokens, "
        "{} distinct batches of {} windows (train.batch_size {} x {} data-parallel ranks); set "
        "train.eval_batches to at most {}, or hold out more text (data.val_fraction)",
        o_.eval_batches, data_.description, windows, o_.seq_len + 1, distinct, per_batch,
        o_.batch_size, layout_.dp(), distinct));
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
    // Its step agrees with the checkpoint's (check_counters, in load).
    train_data_->restore(ck.meta["loader"]);
}

void Trainer::print_banner(double unigram) {
    say("apiary train: {} model, {:.2f}M parameters, {} layers, C={}, V={}, {}\n",
        core::arch_name(spec_.arch), double(spec_.num_params()) / 1e6, spec_.n_layer, spec_.n_embd,
        spec_.vocab_size, o_.precision_name);
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
    if (o_.curriculum_start > 0) {
        const auto [b0, t0] = train_data_->shape_at(0);
        say("  curriculum ({}): step 1 has micro-batches of {} rows x T={}, growing to T={} by "
            "step {}; LR schedule by {}\n",
            o_.curriculum_mode, b0 / o_.grad_accum, t0, o_.seq_len, o_.curriculum_steps + 1,
            o_.lr_by_tokens ? "tokens" : "steps");
    }
    say("  {} steps x {} tokens (B={} T={} accum={}), {} threads/rank, matmul peak {:.0f} "
        "GFLOP/s/rank\n",
        o_.steps, o_.batch_size * o_.seq_len * o_.grad_accum * layout_.dp(), o_.batch_size,
        o_.seq_len, o_.grad_accum, core::num_threads(), peak_ / 1e9);
    if (engine_.world_size() > 1) say("  layout {}\n", layout_.describe());
    say("  run directory {}{}\n", o_.run_dir,
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
    if (layout_.ep > 1) {
        rec["ep_comm_s"] = t.ep_comm;  // the MoE blocks' token all-to-alls
        rec["ep_comm_bytes"] = engine_.ep_bytes();
    }
    if (layout_.pp() > 1) {
        rec["pp_wait_s"] = t.pp_wait;
        rec["pp_bytes"] = engine_.pp_bytes();
        rec["bubble"] = t.bubble();
    }
    return rec;
}

obs::StepReport Trainer::step_report(int64_t step, const StepOutcome& s) const {
    const parallel::StepResult& r = s.result;
    const data::Batch& batch = *s.batch;
    const auto& t = engine_.times();
    const auto& scaler = engine_.loss_scaler();
    obs::StepReport o;
    o.step = step + 1;
    o.loss = r.loss();
    o.lr = s.lr;
    o.grad_norm = r.grad_norm;
    o.loss_scale = scaler.enabled() ? scaler.scale() : 1.0;
    o.skipped_steps = scaler.skipped_steps();
    o.step_s = s.dt;
    o.data_wait_s = s.data_wait;
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

// Starts a save (committed at once, or by a later poll when async).
void Trainer::save(int64_t step) {
    APIARY_TRACE("checkpoint", core::trace::Kind::checkpoint, -1, -1, nullptr, step);
    if (saver_.poll(true)) note_save();  // the one in flight first
    saver_.save(step, checkpoint_meta(step));
    if (!saver_.in_flight()) note_save();  // a synchronous save, committed
}

json Trainer::checkpoint_meta(int64_t step) const {
    return {{"tokenizer", data_.tokenizer_json.empty() ? "" : kTokenizerFile},
            {"tokenizer_hash", data_.tokenizer_hash},
            // Where the training stream continues (global, the same on every rank).
            {"loader", train_data_->state()},
            {"config_hash", fmt::format("{:016x}", c_.hash())},
            {"precision", o_.precision_name},
            // Positions beyond the trained length were never trained:
            // generation keeps its window within it.
            {"seq_len", o_.seq_len},
            {"tokens", schedule_.tokens_before(step)},
            {"skipped_batches", skip_batches_},
            {"loss_scaler", engine_.loss_scaler().state()}};
}

}  // namespace apiary::train
