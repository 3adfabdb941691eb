#pragma once
// What a training run reports to the outside while it runs, behind a few
// calls from the trainer's loop: per-rank Prometheus metrics, health
// checks that can slow every rank down or stop the job, and traces of the
// configured steps. The trainer owns one per rank:
//
//   RunObserver obs(config, world, rank, log);
//   obs.start(first_step)                      metrics server; trace range checked
//   loop: obs.before_step(step)                traces on/off (collective barrier once)
//         engine.set_rank_signals(obs.poll_health(), obs.busy_seconds())
//         ... the step ...
//         switch (obs.after_step(report))      metrics; the job's health -> action
//   obs.finish()                               traces written, metrics linger

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "comm/process_group.h"
#include "obs/health.h"
#include "obs/keys.h"
#include "obs/metrics.h"

namespace apiary::core {
class Config;
}

namespace apiary::obs {

// Model FLOPs utilisation: the model FLOPs done in `seconds` over `ranks`
// times one rank's matmul peak. The peak is measured once, at start; when
// the cores were busier then than later (other processes, a clock that rose
// since) the ratio passes 1, which no run reaches: it is capped at 1 and
// `capped` says so (the run's line and metrics.jsonl show it).
struct Mfu {
    double value = 0;
    bool capped = false;
};
Mfu model_flops_utilisation(double flops, double seconds, double peak_flops, int ranks);

// What the trainer knows after a step.
struct StepReport {
    int64_t step = 0;  // 1-based
    double loss = 0, lr = 0, grad_norm = 0, loss_scale = 1;
    int64_t skipped_steps = 0;
    double step_s = 0, data_wait_s = 0;
    double tokens = 0, flops = 0;  // of the whole step, all ranks
    double forward_s = 0, backward_s = 0, optimizer_s = 0, exposed_comm_s = 0;
    double busy_max_s = 0, busy_min_s = 0;  // over ranks (the engine's exchange)
    int job_health = 0;                     // the worst rank's level
};

enum class AfterStep { go_on, stop_unhealthy };

class RunObserver {
  public:
    using Log = std::function<void(const std::string& line)>;
    // peak_flops: one rank's matmul peak (for MFU). log: a line for the
    // rank's log (and the console on the first rank).
    RunObserver(const core::Config& c, comm::ProcessGroup* world, double peak_flops, Log log);
    ~RunObserver();

    void start(int64_t first_step);
    void before_step(int64_t step_index);
    // Reads the sensors when due (health.check_every_s) and logs a change;
    // this rank's level, for the engine to reduce with the step's scalars.
    int poll_health();
    double busy_seconds() const { return busy_s_; }
    AfterStep after_step(const StepReport& r);
    void eval_done(double loss);
    // Expert load per MoE block, for the Prometheus endpoint.
    void moe_load(std::vector<MoeLoad> load);
    // A committed save: from start to commit, the training thread's stall,
    // and the bytes written (all ranks).
    void checkpoint_done(double seconds, double stall_s, double bytes);
    void finish();
    // The reason the job stopped for its health ("" if it did not).
    const std::string& stop_reason() const { return stop_reason_; }
    bool tracing() const;

  private:
    void start_metrics();
    void write_trace();
    void apply_health(const StepReport& r);

    MetricsOptions mo_;
    HealthOptions ho_;
    ProfileOptions po_;
    comm::ProcessGroup* world_;
    int rank_, world_size_;
    std::string run_dir_, run_name_;
    int64_t train_steps_;
    double peak_;
    Log log_;
    HealthMonitor health_;
    std::unique_ptr<MetricsServer> metrics_;
    double busy_s_ = 0;
    bool throttled_ = false;
    int base_threads_ = 0;
    std::string stop_reason_;
    int64_t sync_ns_ = 0, sync_unix_ns_ = 0;
    bool trace_open_ = false;
    bool trace_written_ = false;
};

}  // namespace apiary::obs
