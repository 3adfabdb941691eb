#include "obs/observer.h"

#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "core/config.h"
#include "core/error.h"
#include "core/threads.h"
#include "core/trace.h"
#include "obs/trace_file.h"

namespace apiary::obs {

namespace fs = std::filesystem;

namespace {

double monotonic_s() { return double(core::trace::now_ns()) * 1e-9; }

int64_t unix_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
}

}  // namespace

Mfu model_flops_utilisation(double flops, double seconds, double peak_flops, int ranks) {
    if (!(seconds > 0) || !(peak_flops > 0) || ranks < 1) return {};
    const double raw = flops / seconds / peak_flops / double(ranks);
    if (raw > 1.0) return {1.0, true};
    return {raw, false};
}

RunObserver::RunObserver(const core::Config& c, comm::ProcessGroup* world, double peak_flops,
                         Log log)
    : mo_(MetricsOptions::from_config(c)),
      ho_(HealthOptions::from_config(c)),
      po_(ProfileOptions::from_config(c)),
      world_(world && world->size() > 1 ? world : nullptr),
      rank_(world ? world->rank() : 0),
      world_size_(world ? world->size() : 1),
      run_dir_(c.get_string("run.dir")),
      run_name_(fs::path(run_dir_).filename().string()),
      train_steps_(c.get_int("train.steps")),
      peak_(peak_flops),
      log_(std::move(log)),
      health_(ho_, rank_) {
    if (po_.any() && po_.last > train_steps_) {
        throw ConfigError(fmt::format(
            "profile.steps = '{}' goes beyond the run's train.steps = {}: trace steps within "
            "1-{}",
            c.get_string("profile.steps"), train_steps_, train_steps_));
    }
    if (run_name_.empty()) run_name_ = fs::path(run_dir_).parent_path().filename().string();
}

RunObserver::~RunObserver() {
    if (trace_open_) core::trace::set_on(false);
    if (throttled_) core::set_num_threads(base_threads_);
}

bool RunObserver::tracing() const { return trace_open_; }

void RunObserver::start_metrics() {
    if (!mo_.enabled) return;
    try {
        metrics_ = std::make_unique<MetricsServer>(
            mo_.address, mo_.port(rank_), rank_, run_name_,
            health_.sensors().empty() ? nullptr : &health_.sensors());
    } catch (const IoError& e) {
        if (mo_.required) {
            throw IoError(
                fmt::format("rank {}: {}; metrics.required = true: choose a free range "
                            "with metrics.port_base (rank r uses port_base + r)",
                            rank_, e.what()));
        }
        fmt::print(stderr,
                   "apiary: warning: rank {}: {}; training goes on without this rank's metrics "
                   "(set metrics.port_base to a free range, or metrics.required = true to stop "
                   "instead)\n",
                   rank_, e.what());
    }
}

void RunObserver::start(int64_t first_step) {
    start_metrics();
    if (po_.any() && first_step >= po_.last) {
        log_(fmt::format("profile.steps = {}-{} lies before this run's first step {}: no trace\n",
                         po_.first, po_.last, first_step + 1));
    }
}

void RunObserver::before_step(int64_t step_index) {
    const int64_t s = step_index + 1;
    if (trace_open_ && s > po_.last) write_trace();
    if (!po_.any() || trace_open_ || trace_written_ || !po_.covers(s)) return;
    // Every rank leaves this barrier at nearly the same instant: times in the
    // trace count from here, which lines the ranks' timelines up.
    if (world_) world_->barrier({"trace_sync", 0})->wait();
    sync_ns_ = core::trace::now_ns();
    sync_unix_ns_ = unix_ns();
    core::trace::take();  // nothing recorded before the range
    core::trace::set_thread_name("main");
    core::trace::set_on(true);
    trace_open_ = true;
}

void RunObserver::write_trace() {
    core::trace::set_on(false);
    trace_open_ = false;
    trace_written_ = true;
    TraceMeta m;
    m.rank = rank_;
    m.world_size = world_size_;
    m.first_step = po_.first;
    m.last_step = po_.last;
    m.sync_ns = sync_ns_;
    m.sync_unix_ns = sync_unix_ns_;
    m.run = run_name_;
    char host[256] = "";
    ::gethostname(host, sizeof(host) - 1);
    m.host = host;
    const std::string path =
        (fs::path(run_dir_) / "trace" / fmt::format("rank_{:05d}.json", rank_)).string();
    write_trace_file(path, m, core::trace::take());
    log_(fmt::format("trace of steps {}-{} written to {}/trace/ (`apiary trace summary {}`)\n",
                     po_.first, po_.last, run_dir_, run_dir_));
}

int RunObserver::poll_health() {
    const int level = health_.poll(monotonic_s());
    if (health_.changed()) {
        if (level > 0) {
            if (metrics_) metrics_->add_health_event();
            fmt::print(stderr, "apiary: warning: rank {}: health: {}\n", rank_, health_.reason());
            log_(fmt::format("rank {}: health: {}\n", rank_, health_.reason()));
        } else {
            log_(fmt::format("rank {}: health: sensors back within limits\n", rank_));
        }
    }
    return level;
}

void RunObserver::apply_health(const StepReport& r) {
    if (ho_.action != HealthAction::throttle) return;
    if (r.job_health > 0 && !throttled_) {
        throttled_ = true;
        base_threads_ = core::num_threads();
        const int n =
            ho_.throttle_threads > 0 ? ho_.throttle_threads : std::max(1, base_threads_ / 2);
        core::set_num_threads(n);
        log_(
            fmt::format("step {}: a rank is over its health limits: every rank throttles "
                        "({} threads, {:.2f} s pause between steps) until it is back\n",
                        r.step, n, ho_.pause_s));
    } else if (r.job_health == 0 && throttled_) {
        throttled_ = false;
        core::set_num_threads(base_threads_);
        log_(fmt::format("step {}: every rank within its health limits: full speed again\n",
                         r.step));
    }
    if (throttled_ && ho_.pause_s > 0) {
        std::this_thread::sleep_for(std::chrono::duration<double>(ho_.pause_s));
    }
}

AfterStep RunObserver::after_step(const StepReport& r) {
    // Time spent waiting on other ranks says nothing about this one. The
    // step's extremes are over the busy times sent with it (the previous
    // step's), as this rank's was.
    const double sent_s = busy_s_;
    busy_s_ = std::max(0.0, r.step_s - r.exposed_comm_s);
    if (metrics_) {
        StepValues v;
        v.step = double(r.step);
        v.loss = r.loss;
        v.tokens_per_s = r.step_s > 0 ? r.tokens / r.step_s : 0;
        v.step_s = r.step_s;
        v.mfu = model_flops_utilisation(r.flops, r.step_s, peak_, world_size_).value;
        v.grad_norm = r.grad_norm;
        v.lr = r.lr;
        v.loss_scale = r.loss_scale;
        v.skipped_steps = double(r.skipped_steps);
        v.forward_s = r.forward_s;
        v.backward_s = r.backward_s;
        v.optimizer_s = r.optimizer_s;
        v.exposed_comm_s = r.exposed_comm_s;
        v.data_wait_s = r.data_wait_s;
        v.busy_s = busy_s_;
        v.busy_sent_s = sent_s;
        v.busy_max_s = r.busy_max_s;
        v.busy_min_s = r.busy_min_s;
        v.last_step_unix_s = double(unix_ns()) * 1e-9;
        v.health_level = health_.level();
        v.job_health = r.job_health;
        metrics_->update(v);
    }
    if (r.job_health > 0 && ho_.action == HealthAction::checkpoint) {
        stop_reason_ = r.job_health > 0 && health_.level() > 0
                           ? fmt::format("rank {}: {}", rank_, health_.reason())
                           : "another rank is over its health limits";
        return AfterStep::stop_unhealthy;
    }
    apply_health(r);
    return AfterStep::go_on;
}

void RunObserver::eval_done(double loss) {
    if (metrics_) metrics_->set_eval_loss(loss);
}

void RunObserver::moe_load(std::vector<MoeLoad> load) {
    if (metrics_) metrics_->set_moe_load(std::move(load));
}

void RunObserver::checkpoint_done(double seconds, double stall_s, double bytes) {
    if (metrics_) metrics_->add_checkpoint(seconds, stall_s, bytes, double(unix_ns()) * 1e-9);
}

void RunObserver::finish() {
    if (trace_open_) write_trace();
    if (throttled_) {
        core::set_num_threads(base_threads_);
        throttled_ = false;
    }
    if (metrics_ && mo_.linger_s > 0) {
        std::this_thread::sleep_for(std::chrono::duration<double>(mo_.linger_s));
    }
}

}  // namespace apiary::obs
