#pragma once
// The per-rank Prometheus endpoint: prometheus-cpp serves /metrics over
// HTTP and writes the text format; what it serves is built at scrape time
// from the last step's values (copied in once per step under a mutex) and
// from the process and the machine (/proc, the allocator, sysfs sensors),
// read only when Prometheus asks. Every series carries the labels rank and
// run. Names: docs/observability.md.

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace prometheus {
class Collectable;
class Exposer;
}  // namespace prometheus

namespace apiary::obs {

class Sensors;

// What the trainer reports after each step (NaN: not known / not applicable).
struct StepValues {
    double step = 0;
    double loss = 0;
    double eval_loss = -1;  // < 0: no evaluation yet
    double tokens_per_s = 0;
    double step_s = 0;
    double mfu = 0;
    double grad_norm = 0;
    double lr = 0;
    double loss_scale = 1;
    double skipped_steps = 0;
    // Phases of the last step (seconds).
    double forward_s = 0, backward_s = 0, optimizer_s = 0, exposed_comm_s = 0, data_wait_s = 0;
    // This rank's busy time (not waiting on peers) and the extremes over ranks.
    double busy_s = 0, busy_max_s = 0, busy_min_s = 0;
    // The busy seconds this rank sent with this step's scalars (its previous
    // step's): the extremes are over those, so the straggler ratio uses it.
    double busy_sent_s = 0;
    double last_step_unix_s = 0;
    int health_level = 0;  // this rank
    int job_health = 0;    // the worst rank
};

// Expert load of one mixture-of-experts block over the last logging
// window, summed over the data-parallel ranks.
struct MoeLoad {
    int layer = -1;
    std::vector<double> tokens;  // (E) choices routed to each expert
    double imbalance = 0;        // max / mean of tokens
    double dropped = 0;          // choices over capacity, all experts
};

// The metrics endpoint's worker threads (each serves one connection at a
// time) and how long one waits for a client to send or read.
inline constexpr int kMetricsThreads = 8;
inline constexpr int kMetricsRequestTimeoutMs = 2000;

class MetricsServer {
  public:
    // Binds address:port at once. Throws IoError with a clear message if
    // the port cannot be bound (in use, or not allowed).
    MetricsServer(const std::string& address, int port, int rank, const std::string& run,
                  const Sensors* sensors);
    ~MetricsServer();
    MetricsServer(const MetricsServer&) = delete;
    MetricsServer& operator=(const MetricsServer&) = delete;

    void update(const StepValues& v);
    // Cumulative phase seconds, checkpoint and health counters.
    void add_checkpoint(double seconds, double stall_s, double bytes, double unix_s);
    void add_health_event();
    void set_eval_loss(double loss);
    void set_moe_load(std::vector<MoeLoad> load);
    int port() const { return port_; }

    struct State;  // shared with the collector

  private:
    std::shared_ptr<State> state_;
    std::shared_ptr<prometheus::Collectable> collector_;  // the exposer holds a weak reference
    std::unique_ptr<prometheus::Exposer> exposer_;
    int port_;
};

}  // namespace apiary::obs
