#pragma once
// One training run (internal to train/; run_training and resume_training in
// trainer.cc build it). Trainer::run is the loop, and reads in one sitting:
//
//   for each step until train.steps or an agreed stop:
//       train_one         batch -> Engine::train_step (forward, backward,
//                         gradient reduction, clip, AdamW)
//       roll back         on a non-finite or spiking loss (train.rollback)
//       check_step        diverged / fp16 overflow, health (the observer)
//       window            the averages of the steps since the last log line
//       maybe_evaluate    held-out loss every train.eval_every steps
//       maybe_log         metrics.jsonl and the progress line
//       maybe_checkpoint  every train.ckpt_every steps (or Young/Daly), and
//                         commits of asynchronous saves
//   finish                stop message, final evaluation and checkpoint,
//                         memory record, summary
//
// The parts below (RunLog, MetricsWindow, SpikeCheck) hold no reference to
// the engine; Trainer's methods are each one of the named steps above.

#include <chrono>
#include <cstdint>
#include <deque>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>

#include "comm/mesh.h"
#include "comm/process_group.h"
#include "core/allocator.h"
#include "core/config.h"
#include "core/model_spec.h"
#include "data/loader.h"
#include "obs/observer.h"
#include "parallel/engine.h"
#include "parallel/layout.h"
#include "train/checkpoint.h"
#include "train/options.h"
#include "train/run_dir.h"
#include "train/schedule.h"
#include "train/train_data.h"
#include "train/trainer.h"

namespace apiary::train {

// The run's console and per-rank log: the first rank prints; every rank
// writes the same lines to logs/rank_NNNNN.log, with what it alone knows
// added by note().
class RunLog {
  public:
    explicit RunLog(bool main_rank) : main_(main_rank) {}
    void open(const std::string& run_dir, int rank, bool append);
    void say(const std::string& text);
    void note(std::string text);

  private:
    bool main_;
    std::ofstream file_;
};

// The steps since the last log line: their mean loss, time and rate.
struct MetricsWindow {
    double loss = 0, time_s = 0, flops = 0;
    int64_t steps = 0, tokens = 0;
    void add(double step_loss, double dt, int64_t step_tokens, double step_flops) {
        loss += step_loss;
        time_s += dt;
        steps += 1;
        tokens += step_tokens;
        flops += step_flops;
    }
    void reset() { *this = MetricsWindow{}; }
    double mean_loss() const { return steps ? loss / double(steps) : 0.0; }
    double step_time() const { return steps ? time_s / double(steps) : 0.0; }
    double tokens_per_s() const { return time_s > 0 ? double(tokens) / time_s : 0.0; }
};

// train.spike_zscore: a loss more than z standard deviations above the mean
// of the last train.spike_window good steps is a spike.
class SpikeCheck {
  public:
    SpikeCheck(double z_limit, int64_t window) : z_limit_(z_limit), window_(size_t(window)) {}
    // Why `loss` is a spike ("" if it is not; then it joins the window).
    std::string check(double loss);
    void clear() { recent_.clear(); }

  private:
    double z_limit_;
    size_t window_;
    std::deque<double> recent_;
};

// What one step of the loop did.
struct StepOutcome {
    const data::Batch* batch = nullptr;
    int64_t batch_number = 0;  // the loader's (1-based)
    parallel::StepResult result;
    double lr = 0, dt = 0, data_wait = 0;
};

class Trainer {
  public:
    // peak_flops: one rank's measured matmul peak in the run's precision
    // (measure_peak), the denominator of MFU.
    Trainer(const core::Config& c, const TrainOptions& o, const TrainData& data,
            comm::ProcessGroup* world, double peak_flops);
    void init_fresh() { engine_.init(o_.seed); }
    // This run is the k-th restart of a supervised job (apiary launch).
    void set_restart(int k) { restart_ = k; }
    // Loads weights, optimizer state, loss scaler and step from a checkpoint.
    void load(const CheckpointRef& ck);
    TrainSummary run(bool append_metrics);

    // Sets the process's compute threads (train.threads) and measures the
    // matmul peak in the run's precision: before the data is prepared, so
    // that a first run's tokenizer training does not share the cores with
    // the measurement and make MFU read several times too high.
    static double measure_peak(const TrainOptions& o);

  private:
    // ---- the loop's parts, in the order a step runs them ----
    void begin(bool append_metrics);
    StepOutcome train_one(int64_t step);
    // The step after which the loop continues if the step was rolled back.
    std::optional<int64_t> maybe_roll_back(int64_t step, const StepOutcome& s);
    // Throws on divergence; true when the observer asks to stop for health.
    bool check_step(int64_t step, const StepOutcome& s);
    // False when a stop signal cut the evaluation short.
    bool maybe_evaluate(int64_t done, bool last);
    void maybe_log(int64_t done, const StepOutcome& s, bool last);
    void maybe_checkpoint(int64_t done, bool last);
    TrainSummary finish(int64_t step, bool stop);

    // ---- what the parts use ----
    std::unique_ptr<data::Loader> make_loader(const std::string& split) const;
    const data::Batch& next_batch(int64_t step);
    std::optional<double> evaluate();
    void check_eval_batches() const;
    double unigram_entropy() const;
    void restore_data(const CheckpointRef& ck);
    void print_banner(double unigram);
    std::string bad_step(const parallel::StepResult& r);
    int64_t roll_back(int64_t step, int64_t batch, const std::string& why);
    void save(int64_t step);
    void note_save();
    void write_memory_record(int64_t step, const core::MemStats& mem);
    nlohmann::json checkpoint_meta(int64_t step) const;
    nlohmann::json step_record(int64_t step, const parallel::StepResult& r, double lr);
    obs::StepReport step_report(int64_t step, const StepOutcome& s) const;
    void write_metrics(const nlohmann::json& record) {
        if (metrics_) metrics_->write(record);
    }
    template <typename... Args>
    void say(fmt::format_string<Args...> f, Args&&... args) {
        log_.say(fmt::format(f, std::forward<Args>(args)...));
    }
    bool main_rank() const { return engine_.main_rank(); }

    const core::Config& c_;
    const TrainOptions o_;
    const TrainData& data_;
    core::ModelSpec spec_;
    parallel::ParallelLayout layout_;
    comm::MeshCoord coord_;
    double peak_;  // matmul FLOP/s of one rank in the run's precision
    std::unique_ptr<data::Loader> train_data_, val_data_;
    nlohmann::json val_start_;  // every evaluation reads the same held-out windows
    LrSchedule schedule_;
    parallel::Engine engine_;
    CheckpointSaver saver_;
    RunLog log_;
    std::unique_ptr<obs::RunObserver> obs_;  // metrics, health, traces
    std::optional<MetricsLog> metrics_;      // metrics.jsonl (the first rank's)
    SpikeCheck spikes_;
    MetricsWindow window_;
    TrainSummary summary_;
    std::chrono::steady_clock::time_point t_start_;
    int64_t start_step_ = 0;
    // Loader batch numbers (1-based) never trained on: the batches a
    // rollback skipped. Saved in every checkpoint, so a resume skips them.
    std::set<int64_t> skip_batches_;
    int64_t rollbacks_ = 0;
    int restart_ = 0;
    double last_eval_ = NAN;
    int64_t ckpt_every_ = 0;  // the Young/Daly interval, with train.ckpt_every_auto
    bool ckpt_interval_logged_ = false;
    double last_step_s_ = 0;
};

}  // namespace apiary::train
