#include "obs/metrics.h"

#include <fmt/format.h>
#include <prometheus/collectable.h>
#include <prometheus/exposer.h>
#include <prometheus/metric_family.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>

#include "comm/traffic.h"
#include "core/allocator.h"
#include "core/error.h"
#include "core/threads.h"
#include "obs/sensors.h"

namespace apiary::obs {

struct MetricsServer::State {
    std::mutex mu;
    StepValues v;
    std::string rank, run;
    std::string host;  // gethostname(): which machine this rank is on
    const Sensors* sensors = nullptr;
    // Cumulative over the run.
    double phase_totals[5] = {0, 0, 0, 0, 0};
    double checkpoint_s = 0, checkpoint_stall_s = 0, checkpoint_bytes = 0, checkpoint_unix_s = 0,
           checkpoints = 0;
    double health_events = 0;
    double start_unix_s = 0;
    std::vector<MoeLoad> moe;
    // CPU utilisation between two scrapes.
    double last_cpu_s = -1, last_wall_s = 0;
};

namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

constexpr const char* kPhases[5] = {"forward", "backward", "optimizer", "exposed_comm",
                                    "data_wait"};

double unix_now() {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
        .count();
}

double process_cpu_seconds() {
    rusage ru{};
    ::getrusage(RUSAGE_SELF, &ru);
    return double(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
           1e-6 * double(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

double resident_bytes() {
    FILE* f = std::fopen("/proc/self/statm", "r");
    if (!f) return NAN;
    long size = 0, rss = 0;
    const int n = std::fscanf(f, "%ld %ld", &size, &rss);
    std::fclose(f);
    return n == 2 ? double(rss) * double(::sysconf(_SC_PAGESIZE)) : NAN;
}

// Families in the order first added; samples keep the rank and run labels.
class Builder {
  public:
    Builder(std::string rank, std::string run) : rank_(std::move(rank)), run_(std::move(run)) {}
    void add(const std::string& name, const std::string& help, MetricType type, double value,
             std::vector<ClientMetric::Label> labels = {}) {
        if (std::isnan(value)) return;  // unknown: absent, not zero
        auto [it, fresh] = index_.emplace(name, families_.size());
        if (fresh) families_.push_back({name, help, type, {}});
        ClientMetric m;
        m.label = {{"rank", rank_}, {"run", run_}};
        m.label.insert(m.label.end(), labels.begin(), labels.end());
        if (type == MetricType::Counter) {
            m.counter.value = value;
        } else {
            m.gauge.value = value;
        }
        families_[it->second].metric.push_back(std::move(m));
    }
    void gauge(const std::string& name, const std::string& help, double value,
               std::vector<ClientMetric::Label> labels = {}) {
        add(name, help, MetricType::Gauge, value, std::move(labels));
    }
    void counter(const std::string& name, const std::string& help, double value,
                 std::vector<ClientMetric::Label> labels = {}) {
        add(name, help, MetricType::Counter, value, std::move(labels));
    }
    std::vector<MetricFamily> take() { return std::move(families_); }

  private:
    std::string rank_, run_;
    std::map<std::string, size_t> index_;
    std::vector<MetricFamily> families_;
};

void add_step(Builder& b, const StepValues& v, const std::string& host) {
    b.gauge("apiary_step", "last completed optimizer step", v.step);
    b.gauge("apiary_loss", "training loss of the last step (nats/token, global batch)", v.loss);
    if (v.eval_loss >= 0)
        b.gauge("apiary_eval_loss", "last held-out loss (nats/token)", v.eval_loss);
    b.gauge("apiary_tokens_per_second", "tokens per second of the last step (all ranks)",
            v.tokens_per_s);
    b.gauge("apiary_step_seconds", "wall time of the last step", v.step_s);
    b.gauge("apiary_mfu", "model FLOPs utilisation of the last step (all ranks' peaks)", v.mfu);
    b.gauge("apiary_grad_norm", "global gradient L2 norm before clipping", v.grad_norm);
    b.gauge("apiary_learning_rate", "learning rate of the last step", v.lr);
    b.gauge("apiary_loss_scale", "dynamic loss scale (fp16; 1 otherwise)", v.loss_scale);
    b.counter("apiary_skipped_steps_total", "steps skipped for fp16 overflow", v.skipped_steps);
    const double phases[5] = {v.forward_s, v.backward_s, v.optimizer_s, v.exposed_comm_s,
                              v.data_wait_s};
    for (int i = 0; i < 5; ++i) {
        b.gauge("apiary_phase_seconds", "seconds of the last step by phase", phases[i],
                {{"phase", kPhases[i]}});
    }
    b.gauge("apiary_rank_busy_seconds",
            "this rank's time in the last step not spent waiting on other ranks", v.busy_s);
    b.gauge("apiary_busy_seconds_slowest_rank", "the busiest rank's busy seconds", v.busy_max_s);
    b.gauge("apiary_busy_seconds_fastest_rank", "the least busy rank's busy seconds", v.busy_min_s);
    // With the host: the straggler's series names the machine to look at.
    b.gauge("apiary_straggler_ratio",
            "this rank's busy seconds over the least busy rank's (1: not a straggler)",
            v.busy_min_s > 0 ? v.busy_sent_s / v.busy_min_s : NAN, {{"host", host}});
    b.gauge("apiary_last_step_timestamp_seconds", "unix time the last step ended",
            v.last_step_unix_s);
    b.gauge("apiary_health_unhealthy", "1 while this rank's sensors are over their limits",
            v.health_level);
    b.gauge("apiary_health_job_unhealthy", "1 while any rank is over its limits", v.job_health);
}

void add_process(Builder& b, MetricsServer::State& s) {
    const auto mem = core::mem_stats();
    for (int c = 0; c < core::kNumMemCategories; ++c) {
        const std::string cat = core::category_name(core::MemCategory(c));
        b.gauge("apiary_memory_bytes", "allocator bytes in use by category",
                double(mem.current[size_t(c)]), {{"category", cat}});
        b.gauge("apiary_memory_peak_bytes", "allocator high-water mark by category",
                double(mem.peak[size_t(c)]), {{"category", cat}});
    }
    b.gauge("apiary_process_resident_bytes", "resident set size of this rank's process",
            resident_bytes());
    const double cpu = process_cpu_seconds(), wall = unix_now();
    b.counter("apiary_process_cpu_seconds_total", "CPU seconds of this rank's process", cpu);
    if (s.last_cpu_s >= 0 && wall > s.last_wall_s) {
        b.gauge("apiary_cpu_utilisation",
                "CPU seconds per second since the previous scrape, over the cores available",
                (cpu - s.last_cpu_s) / (wall - s.last_wall_s) / double(core::available_cores()));
    }
    s.last_cpu_s = cpu;
    s.last_wall_s = wall;
    const auto bytes = comm::traffic_bytes();
    const auto calls = comm::traffic_calls();
    for (int op = 0; op < comm::kNumCollOps; ++op) {
        if (calls[size_t(op)] == 0) continue;
        const char* name = comm::op_name(comm::CollOp(op));
        b.counter("apiary_comm_bytes_total", "bytes communicated by op (the caller's buffers)",
                  double(bytes[size_t(op)]), {{"op", name}});
        b.counter("apiary_comm_calls_total", "communication calls by op", double(calls[size_t(op)]),
                  {{"op", name}});
    }
}

void add_sensors(Builder& b, const Sensors* sensors) {
    if (!sensors) return;
    const SensorReadings r = sensors->read();
    for (const auto& t : r.temperatures) {
        b.gauge("apiary_temperature_celsius", "temperature sensors (hwmon, thermal zones)",
                t.celsius, {{"sensor", t.sensor}});
    }
    for (const auto& c : r.clocks) {
        b.gauge("apiary_cpu_frequency_hertz", "current CPU clock", c.hz,
                {{"cpu", std::to_string(c.cpu)}});
        if (c.max_hz > 0) {
            b.gauge("apiary_cpu_frequency_max_hertz", "maximum CPU clock", c.max_hz,
                    {{"cpu", std::to_string(c.cpu)}});
        }
    }
    if (r.throttle_events >= 0) {
        b.counter("apiary_thermal_throttle_events_total", "kernel thermal-throttle events",
                  double(r.throttle_events));
    }
}

class Collector : public prometheus::Collectable {
  public:
    explicit Collector(std::shared_ptr<MetricsServer::State> s) : s_(std::move(s)) {}
    std::vector<MetricFamily> Collect() const override {
        std::lock_guard<std::mutex> lock(s_->mu);
        Builder b(s_->rank, s_->run);
        b.gauge("apiary_up", "1 while the rank's trainer runs", 1.0);
        b.gauge("apiary_rank_info", "1; the host label names the machine this rank runs on", 1.0,
                {{"host", s_->host}});
        b.gauge("apiary_start_timestamp_seconds", "unix time the run started", s_->start_unix_s);
        if (s_->v.step > 0) add_step(b, s_->v, s_->host);
        for (const MoeLoad& m : s_->moe) {
            const std::string layer = std::to_string(m.layer);
            for (size_t e = 0; e < m.tokens.size(); ++e) {
                b.gauge("apiary_moe_expert_tokens",
                        "choices routed to each expert of an MoE block, last logging window",
                        m.tokens[e], {{"layer", layer}, {"expert", std::to_string(e)}});
            }
            b.gauge("apiary_moe_load_imbalance",
                    "max / mean of an MoE block's expert loads (1: balanced)", m.imbalance,
                    {{"layer", layer}});
            b.gauge("apiary_moe_dropped_tokens",
                    "choices an MoE block dropped over capacity, last logging window", m.dropped,
                    {{"layer", layer}});
        }
        for (int i = 0; i < 5; ++i) {
            b.counter("apiary_phase_seconds_total", "seconds by phase, summed over steps",
                      s_->phase_totals[i], {{"phase", kPhases[i]}});
        }
        if (s_->checkpoints > 0) {
            b.gauge("apiary_checkpoint_seconds", "duration of the last save, from start to commit",
                    s_->checkpoint_s);
            b.gauge("apiary_checkpoint_stall_seconds",
                    "time the last save held up training (the whole save unless async)",
                    s_->checkpoint_stall_s);
            b.gauge("apiary_checkpoint_bytes",
                    "bytes the last checkpoint wrote (all ranks; incremental: new pieces only)",
                    s_->checkpoint_bytes);
            b.gauge("apiary_checkpoint_timestamp_seconds", "unix time of the last checkpoint",
                    s_->checkpoint_unix_s);
        }
        b.counter("apiary_checkpoints_total", "checkpoints saved", s_->checkpoints);
        b.counter("apiary_health_events_total", "times this rank went over its sensor limits",
                  s_->health_events);
        add_process(b, *s_);
        add_sensors(b, s_->sensors);
        return b.take();
    }

  private:
    std::shared_ptr<MetricsServer::State> s_;
};

}  // namespace

MetricsServer::MetricsServer(const std::string& address, int port, int rank, const std::string& run,
                             const Sensors* sensors)
    : state_(std::make_shared<State>()), port_(port) {
    state_->rank = std::to_string(rank);
    state_->run = run;
    char host[256] = "";
    ::gethostname(host, sizeof(host) - 1);
    state_->host = host;
    state_->sensors = sensors;
    state_->start_unix_s = unix_now();
    const std::string where = fmt::format("{}:{}", address, port);
    try {
        // CivetWeb serves one connection per thread and, by default, waits
        // 30 s for a request that does not come: two idle clients holding a
        // half-sent request each made /metrics unreachable for that long. A
        // short read timeout frees such a thread soon, and spare threads
        // keep scrapes answered meanwhile.
        exposer_ = std::make_unique<prometheus::Exposer>(std::vector<std::string>{
            "listening_ports", where, "num_threads", std::to_string(kMetricsThreads),
            "request_timeout_ms", std::to_string(kMetricsRequestTimeoutMs)});
    } catch (const std::exception& e) {
        throw IoError(
            fmt::format("cannot serve metrics on {} ({}): the port is in use or the "
                        "address is not this machine's",
                        where, e.what()));
    }
    collector_ = std::make_shared<Collector>(state_);
    exposer_->RegisterCollectable(collector_);
}

MetricsServer::~MetricsServer() = default;

void MetricsServer::update(const StepValues& v) {
    std::lock_guard<std::mutex> lock(state_->mu);
    const double eval = state_->v.eval_loss;
    state_->v = v;
    if (v.eval_loss < 0) state_->v.eval_loss = eval;
    const double phases[5] = {v.forward_s, v.backward_s, v.optimizer_s, v.exposed_comm_s,
                              v.data_wait_s};
    for (int i = 0; i < 5; ++i) state_->phase_totals[i] += phases[i];
}

void MetricsServer::add_checkpoint(double seconds, double stall_s, double bytes, double unix_s) {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->checkpoint_s = seconds;
    state_->checkpoint_stall_s = stall_s;
    state_->checkpoint_bytes = bytes;
    state_->checkpoint_unix_s = unix_s;
    state_->checkpoints += 1;
}

void MetricsServer::add_health_event() {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->health_events += 1;
}

void MetricsServer::set_eval_loss(double loss) {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->v.eval_loss = loss;
}

void MetricsServer::set_moe_load(std::vector<MoeLoad> load) {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->moe = std::move(load);
}

}  // namespace apiary::obs
