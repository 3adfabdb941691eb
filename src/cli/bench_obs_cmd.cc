// `apiary bench obs`: what observability costs a training step. One model
// (a preset, one rank) runs its steps in rounds of three, alternating
// "off", "metrics" (the per-step metrics update of the trainer, with a
// Prometheus endpoint being scraped during the step) and "trace" (every
// span recorded), so that each mode sees the same machine; the overhead of
// a mode is the median over rounds of its step time over the same round's
// "off" step. Checked first: the loss stays near ln(V) on random tokens,
// the scrape returns the step's loss, the trace holds every layer's spans.

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "cli/bench_comm.h"
#include "cli/bench_common.h"
#include "core/error.h"
#include "core/model_spec.h"
#include "core/threads.h"
#include "core/timing.h"
#include "core/trace.h"
#include "obs/health.h"
#include "obs/metrics.h"
#include "obs/trace_file.h"
#include "parallel/engine.h"
#include "parallel/layout.h"

namespace apiary::cli {

namespace {

using core::Clock;
using core::median;
using core::seconds_since;

struct Args {
    std::string preset = "gpt2-124m";
    int batch = 4, seq = 256, rounds = 6, warmup = 1, threads = 0, port = 0;
    double scrape_every = 1.0;
    bool json = false;
};

std::string http_get(int port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(uint16_t(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    std::string out;
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
        const std::string req = "GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n";
        if (::write(fd, req.data(), req.size()) == ssize_t(req.size())) {
            char buf[8192];
            for (ssize_t n; (n = ::read(fd, buf, sizeof(buf))) > 0;) out.append(buf, size_t(n));
        }
    }
    ::close(fd);
    return out;
}

int free_port() {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t n = sizeof(a);
    ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n);
    ::close(fd);
    return ntohs(a.sin_port);
}

// Scrapes the endpoint every `every` seconds while `on` is set, as a
// Prometheus would (more often than the 15 s default: a pessimistic load).
struct Scraper {
    std::atomic<bool> on{false}, stop{false};
    std::atomic<int> scrapes{0};
    std::string last;
    std::thread thread;
    Scraper(int port, double every) {
        thread = std::thread([this, port, every] {
            auto next = Clock::now();
            while (!stop.load()) {
                if (on.load() && Clock::now() >= next) {
                    last = http_get(port);
                    scrapes.fetch_add(1);
                    next = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                              std::chrono::duration<double>(every));
                }
                std::this_thread::sleep_for(std::chrono::milliseconds(5));
            }
        });
    }
    ~Scraper() {
        stop = true;
        thread.join();
    }
};

void bench_obs(const Args& a) {
    core::set_num_threads(a.threads);
    const core::ModelSpec& spec = core::preset(a.preset);
    parallel::Engine engine(spec, parallel::one_rank_layout(spec), nullptr, a.batch, a.seq, {});
    engine.init(1);
    // Fresh random rows every round (the same for its three steps): a model
    // shown one batch over and over would learn it, and the loss check below
    // would no longer tell a broken step from a memorised batch.

    const int port = a.port > 0 ? a.port : free_port();
    obs::HealthOptions ho;
    obs::HealthMonitor health(ho, 0);
    obs::MetricsServer server("127.0.0.1", port, 0, "bench",
                              health.sensors().empty() ? nullptr : &health.sensors());
    Scraper scraper(port, a.scrape_every);
    const char* modes[3] = {"off", "metrics", "trace"};
    std::vector<double> times[3];
    std::vector<core::trace::ThreadEvents> kept;
    double loss = 0;
    for (int round = 0; round < a.warmup + a.rounds; ++round) {
        const std::vector<int32_t> rows =
            random_token_rows(a.batch, a.seq, spec.vocab_size, uint64_t(round));
        for (int m = 0; m < 3; ++m) {
            scraper.on = m == 1;
            core::trace::set_on(m == 2);
            const auto t0 = Clock::now();
            const auto r = engine.train_step(rows.data(), a.batch, a.seq, 1e-4, false);
            if (m == 1) {
                // What the trainer adds per step with metrics on.
                obs::StepValues v;
                v.step = round + 1;
                v.loss = r.loss();
                v.step_s = seconds_since(t0);
                v.health_level = health.poll(double(core::trace::now_ns()) * 1e-9);
                server.update(v);
            }
            const double dt = seconds_since(t0);
            core::trace::set_on(false);
            scraper.on = false;
            loss = r.loss();
            if (round >= a.warmup) times[m].push_back(dt);
            if (!a.json)
                fmt::print("  round {} {:<7} {:.3f} s{}\n", round, modes[m], dt,
                           round < a.warmup ? " (warm-up)" : "");
            if (m == 2) {
                auto t = core::trace::take();
                if (kept.empty()) kept = std::move(t);
            }
        }
    }
    const double lnv = std::log(double(spec.vocab_size));
    APIARY_CHECK(std::isfinite(loss) && std::fabs(loss - lnv) < 0.5 * lnv,
                 "loss {} far from ln(V) = {}", loss, lnv);
    APIARY_CHECK(scraper.last.find("apiary_loss{") != std::string::npos,
                 "the scrape did not return the loss ({} scrapes)", scraper.scrapes.load());
    size_t spans = 0, layers = 0;
    for (const auto& t : kept) {
        spans += t.events.size();
        for (const auto& e : t.events) layers += e.layer >= 0;
    }
    APIARY_CHECK(layers >= size_t(2 * spec.n_layer), "the trace has {} layer spans for {} layers",
                 layers, spec.n_layer);
    // Writing the trace happens after the traced steps: timed apart.
    const auto tw = Clock::now();
    obs::write_trace_file((std::filesystem::temp_directory_path() /
                           fmt::format("apiary-bench-obs-{}.json", ::getpid()))
                              .string(),
                          {}, kept);
    const double write_s = seconds_since(tw);
    std::filesystem::remove(std::filesystem::temp_directory_path() /
                            fmt::format("apiary-bench-obs-{}.json", ::getpid()));

    nlohmann::json out = {{"preset", a.preset},
                          {"batch", a.batch},
                          {"seq", a.seq},
                          {"threads", core::num_threads()},
                          {"rounds", a.rounds},
                          {"scrapes", scraper.scrapes.load()},
                          {"spans_per_step", spans},
                          {"trace_write_s", write_s}};
    for (int m = 0; m < 3; ++m) out[std::string(modes[m]) + "_step_s"] = median(times[m]);
    for (int m = 1; m < 3; ++m) {
        std::vector<double> ratio;
        for (size_t i = 0; i < times[0].size(); ++i)
            ratio.push_back(times[m][i] / times[0][i] - 1.0);
        out[std::string(modes[m]) + "_overhead"] = {
            {"median", median(ratio)},
            {"min", *std::min_element(ratio.begin(), ratio.end())},
            {"max", *std::max_element(ratio.begin(), ratio.end())}};
    }
    if (a.json) {
        fmt::print("{}\n", out.dump());
        return;
    }
    fmt::print(
        "bench obs {} B={} T={} threads={}: median step off {:.3f} s, metrics {:.3f} s, trace "
        "{:.3f} s\n",
        a.preset, a.batch, a.seq, core::num_threads(), median(times[0]), median(times[1]),
        median(times[2]));
    for (int m = 1; m < 3; ++m) {
        const auto& o = out[std::string(modes[m]) + "_overhead"];
        fmt::print(
            "  {:<7} overhead {:+.2f}% (median of {} same-round ratios; min {:+.2f}%, max "
            "{:+.2f}%)\n",
            modes[m], 100 * o["median"].get<double>(), a.rounds, 100 * o["min"].get<double>(),
            100 * o["max"].get<double>());
    }
    fmt::print("  {} scrapes; {} spans per traced step, written in {:.3f} s\n",
               scraper.scrapes.load(), spans, write_s);
}

}  // namespace

void add_bench_obs_command(CLI::App* bench) {
    auto* o = bench->add_subcommand(
        "obs", "overhead of metrics and of tracing on a training step (alternating with off)");
    static Args a;
    o->add_option("--preset", a.preset, "model preset")->capture_default_str();
    o->add_option("--batch", a.batch, "micro-batch B")
        ->check(CLI::Range(1, 1 << 16))
        ->capture_default_str();
    o->add_option("--seq", a.seq, "sequence length T")
        ->check(CLI::Range(1, 1 << 20))
        ->capture_default_str();
    o->add_option("--rounds", a.rounds, "timed rounds (each: one step per mode)")
        ->check(CLI::Range(1, 1 << 20))
        ->capture_default_str();
    o->add_option("--warmup", a.warmup, "untimed rounds first")
        ->check(CLI::Range(0, 1 << 20))
        ->capture_default_str();
    o->add_option("--threads", a.threads, "threads (0: all cores)")->capture_default_str();
    o->add_option("--port", a.port, "metrics port (0: a free one)")->capture_default_str();
    o->add_option("--scrape-every", a.scrape_every, "seconds between scrapes during metrics steps")
        ->check(CLI::Range(0.01, 3600.0))
        ->capture_default_str();
    o->add_flag("--json", a.json, "print one JSON object");
    o->callback([] { bench_obs(a); });
}

}  // namespace apiary::cli
