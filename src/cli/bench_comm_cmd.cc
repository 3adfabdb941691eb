// `apiary bench comm`, in the style of nccl-tests: for all_reduce,
// reduce_scatter and all_gather from --min-bytes to --max-bytes, the time,
// algorithm bandwidth and bus bandwidth of apiary's ProcessGroup beside raw
// MPI on a duplicate of the same communicator, measured alternately in the
// same run, plus the machine's memcpy bandwidth. Results are verified before
// anything is timed. Run under mpirun: `mpirun -n 2 apiary bench comm`.
//
// Sizes follow nccl-tests: all_reduce and reduce_scatter count the input
// bytes of one rank, all_gather the output bytes. busbw = algbw * 2(n-1)/n
// for all_reduce and algbw * (n-1)/n for the other two.

#include <fmt/format.h>
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/bench_comm.h"
#include "cli/bench_data.h"
#include "cli/command.h"
#include "comm/config.h"
#include "comm/mpi_backend.h"
#include "core/allocator.h"
#include "core/error.h"
#include "core/timing.h"

namespace apiary::cli {

namespace {

using core::Clock;

struct Options {
    std::string min_bytes = "1K", max_bytes = "256M";
    std::vector<std::string> ops{"all_reduce", "reduce_scatter", "all_gather"};
    int reps = 5;
    int warmup = 2;
    bool json = false;
    std::string config_file;
    std::vector<std::string> sets;
};

size_t parse_bytes(const std::string& text, const char* flag) {
    size_t pos = 0;
    double v = 0;
    try {
        v = std::stod(text, &pos);
    } catch (...) {
        throw ConfigError(fmt::format("{}: '{}' is not a size such as 4K, 16M or 1G", flag, text));
    }
    std::string unit = text.substr(pos);
    double mult = 1;
    if (unit == "K" || unit == "k")
        mult = 1024;
    else if (unit == "M" || unit == "m")
        mult = 1024.0 * 1024;
    else if (unit == "G" || unit == "g")
        mult = 1024.0 * 1024 * 1024;
    else if (!unit.empty() && unit != "B") {
        throw ConfigError(
            fmt::format("{}: unknown unit '{}' in '{}' (use K, M or G)", flag, unit, text));
    }
    return size_t(v * mult);
}

// Buffers sized once for the largest message and faulted in up front: a page
// fault costs more than the copy on the VMs this runs on.
struct Buffers {
    explicit Buffers(size_t bytes) : bytes(bytes) {
        a = static_cast<float*>(core::mem_allocate(bytes, core::MemCategory::buffers));
        b = static_cast<float*>(core::mem_allocate(bytes, core::MemCategory::buffers));
    }
    ~Buffers() {
        core::mem_release(a, bytes, core::MemCategory::buffers);
        core::mem_release(b, bytes, core::MemCategory::buffers);
    }
    size_t bytes;
    float* a;
    float* b;
};

enum class Op { all_reduce, reduce_scatter, all_gather };

Op parse_op(const std::string& s) {
    if (s == "all_reduce") return Op::all_reduce;
    if (s == "reduce_scatter") return Op::reduce_scatter;
    if (s == "all_gather") return Op::all_gather;
    throw ConfigError(
        fmt::format("--ops: unknown op '{}' (use all_reduce, reduce_scatter, all_gather)", s));
}

double bus_factor(Op op, int n) {
    return op == Op::all_reduce ? 2.0 * (n - 1) / n : double(n - 1) / n;
}

// One call of `op` over `bytes`, through apiary (raw = false) or raw MPI.
void run_once(Op op, bool raw, comm::ProcessGroup& g, MPI_Comm peer, Buffers& buf, int64_t count) {
    const int n = g.size();
    switch (op) {
        case Op::all_reduce:
            if (raw)
                MPI_Allreduce(MPI_IN_PLACE, buf.a, int(count), MPI_FLOAT, MPI_SUM, peer);
            else
                g.all_reduce(buf.a, count, core::DType::f32, comm::ReduceOp::sum)->wait();
            break;
        case Op::reduce_scatter:
            if (raw)
                MPI_Reduce_scatter_block(buf.a, buf.b, int(count / n), MPI_FLOAT, MPI_SUM, peer);
            else
                g.reduce_scatter(buf.a, buf.b, count / n, core::DType::f32, comm::ReduceOp::sum)
                    ->wait();
            break;
        case Op::all_gather:
            if (raw)
                MPI_Allgather(buf.a, int(count / n), MPI_FLOAT, buf.b, int(count / n), MPI_FLOAT,
                              peer);
            else
                g.all_gather(buf.a, buf.b, count / n, core::DType::f32)->wait();
            break;
    }
}

// Checks apiary's result against the closed form before anything is timed.
void verify(Op op, comm::ProcessGroup& g, MPI_Comm peer, Buffers& buf, int64_t count) {
    const int n = g.size(), r = g.rank();
    auto fill = [&] {
        for (int64_t i = 0; i < count; ++i) buf.a[i] = float((r + 1) * (i % 13));
    };
    fill();
    run_once(op, false, g, peer, buf, count);
    const float ranks = float(n * (n + 1) / 2);
    int64_t bad = -1;
    if (op == Op::all_reduce) {
        for (int64_t i = 0; i < count && bad < 0; ++i)
            if (buf.a[i] != ranks * float(i % 13)) bad = i;
    } else if (op == Op::reduce_scatter) {
        const int64_t m = count / n;
        for (int64_t i = 0; i < m && bad < 0; ++i) {
            if (buf.b[i] != ranks * float((r * m + i) % 13)) bad = i;
        }
    } else {
        const int64_t m = count / n;
        for (int64_t i = 0; i < count && bad < 0; ++i) {
            if (buf.b[i] != float((i / m + 1) * ((i % m) % 13))) bad = i;
        }
    }
    if (bad >= 0) {
        throw CommError(
            fmt::format("bench comm: {} of {} floats gave a wrong result at element {} "
                        "on rank {}",
                        op == Op::all_reduce       ? "all_reduce"
                        : op == Op::reduce_scatter ? "reduce_scatter"
                                                   : "all_gather",
                        count, bad, r));
    }
    fill();  // the timed calls start from sane values
}

struct Timing {
    double median_s = 0, min_s = 0, max_s = 0;
};

Timing summarize(const std::vector<double>& v) {
    const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
    return {core::median(v), *lo, *hi};
}

double memcpy_gbps(Buffers& buf, size_t bytes) {
    std::vector<double> t;
    for (int rep = 0; rep < 5; ++rep) {
        const auto t0 = Clock::now();
        std::memcpy(buf.b, buf.a, bytes);
        t.push_back(core::seconds_since(t0));
    }
    return double(bytes) / summarize(t).median_s / 1e9;
}

void run(const Options& o) {
    core::Config config = load_config(o.config_file, o.sets);
    const comm::CommOptions copt = comm::options_from(config);
    comm::MpiSession session(copt);
    set_abort_hook([](int code) { comm::abort_mpi(code); });
    auto world = session.world();
    const int n = world->size(), rank = world->rank();
    MPI_Comm peer;
    MPI_Comm_dup(comm::mpi_comm_of(*world), &peer);

    const size_t min_b = parse_bytes(o.min_bytes, "--min-bytes");
    const size_t max_b = parse_bytes(o.max_bytes, "--max-bytes");
    if (min_b < 4 || max_b < min_b) {
        throw ConfigError(fmt::format("--min-bytes {} / --max-bytes {}: need 4 <= min <= max",
                                      o.min_bytes, o.max_bytes));
    }
    std::vector<Op> ops;
    for (const auto& s : o.ops) ops.push_back(parse_op(s));
    Buffers buf(max_b);
    const int64_t max_count = int64_t(max_b / 4);  // f32 elements of the largest call
    world->reserve_scratch(comm::CollOp::all_reduce, max_count, core::DType::f32);
    world->reserve_scratch(comm::CollOp::reduce_scatter, max_count / n, core::DType::f32);

    const double mcpy = memcpy_gbps(buf, max_b);
    if (rank == 0) {
        if (o.json) {
            fmt::print("{}\n", nlohmann::json{{"op", "memcpy"},
                                              {"bytes", max_b},
                                              {"gbps", mcpy},
                                              {"cpu", cpu_model_name()},
                                              {"verify", copt.verify},
                                              {"verify_first", copt.verify_first},
                                              {"verify_every", copt.verify_every}}
                                   .dump());
        } else {
            fmt::print(
                "# apiary bench comm: {} ranks, f32, comm.verify={} (first {}, then every {}), "
                "comm.hierarchical={}, {} reps (median, spread min-max), CPU {}\n# memcpy {} "
                "bytes: {:.2f} GB/s\n",
                n, copt.verify, copt.verify_first, copt.verify_every, copt.hierarchical, o.reps,
                cpu_model_name(), max_b, mcpy);
            fmt::print("{:<15}{:>11}{:>11} | {:>10}{:>8}{:>8} | {:>10}{:>8}{:>8} | {:>6} {}\n",
                       "# op", "bytes", "count", "apiary_us", "algbw", "busbw", "mpi_us", "algbw",
                       "busbw", "ratio", "spread");
        }
    }
    for (Op op : ops) {
        for (size_t bytes = min_b; bytes <= max_b; bytes *= 2) {
            // Whole elements, divisible by the rank count for rs / ag.
            const int64_t count = std::max<int64_t>(n, int64_t(bytes / 4) / n * n);
            verify(op, *world, peer, buf, count);
            const int iters = int(std::clamp<size_t>((32u << 20) / bytes, 2, 1000));
            std::vector<double> t_apiary, t_mpi;
            for (int rep = 0; rep < o.reps + o.warmup; ++rep) {
                for (bool raw : {false, true}) {  // alternate, so noise hits both alike
                    MPI_Barrier(peer);
                    const auto t0 = Clock::now();
                    for (int i = 0; i < iters; ++i) run_once(op, raw, *world, peer, buf, count);
                    double s = core::seconds_since(t0) / iters;
                    MPI_Allreduce(MPI_IN_PLACE, &s, 1, MPI_DOUBLE, MPI_MAX, peer);
                    if (rep >= o.warmup) (raw ? t_mpi : t_apiary).push_back(s);
                }
            }
            const Timing a = summarize(t_apiary), m = summarize(t_mpi);
            const double actual = double(count) * 4;
            const double alg_a = actual / a.median_s / 1e9, alg_m = actual / m.median_s / 1e9;
            const double f = bus_factor(op, n);
            const char* name = op == Op::all_reduce       ? "all_reduce"
                               : op == Op::reduce_scatter ? "reduce_scatter"
                                                          : "all_gather";
            if (rank != 0) continue;
            if (o.json) {
                fmt::print("{}\n", nlohmann::json{{"op", name},
                                                  {"bytes", int64_t(actual)},
                                                  {"count", count},
                                                  {"ranks", n},
                                                  {"dtype", "f32"},
                                                  {"verify", copt.verify},
                                                  {"iters", iters},
                                                  {"apiary",
                                                   {{"time_us", a.median_s * 1e6},
                                                    {"min_us", a.min_s * 1e6},
                                                    {"max_us", a.max_s * 1e6},
                                                    {"algbw_gbps", alg_a},
                                                    {"busbw_gbps", alg_a * f}}},
                                                  {"mpi",
                                                   {{"time_us", m.median_s * 1e6},
                                                    {"min_us", m.min_s * 1e6},
                                                    {"max_us", m.max_s * 1e6},
                                                    {"algbw_gbps", alg_m},
                                                    {"busbw_gbps", alg_m * f}}},
                                                  {"ratio", a.median_s / m.median_s},
                                                  {"memcpy_gbps", mcpy}}
                                       .dump());
            } else {
                fmt::print(
                    "{:<15}{:>11}{:>11} | {:>10.1f}{:>8.2f}{:>8.2f} | {:>10.1f}{:>8.2f}"
                    "{:>8.2f} | {:>6.3f} {:.0f}-{:.0f}/{:.0f}-{:.0f}\n",
                    name, int64_t(actual), count, a.median_s * 1e6, alg_a, alg_a * f,
                    m.median_s * 1e6, alg_m, alg_m * f, a.median_s / m.median_s, a.min_s * 1e6,
                    a.max_s * 1e6, m.min_s * 1e6, m.max_s * 1e6);
            }
            std::fflush(stdout);
        }
    }
    MPI_Comm_free(&peer);
}

}  // namespace

void add_bench_comm_command(CLI::App* bench) {
    auto* cmd = bench->add_subcommand(
        "comm",
        "collective bandwidth (algbw, busbw) beside raw MPI, nccl-tests style; run "
        "under mpirun");
    static Options o;
    cmd->add_option("--min-bytes", o.min_bytes, "smallest message (e.g. 1K)")
        ->capture_default_str();
    cmd->add_option("--max-bytes", o.max_bytes, "largest message (e.g. 256M)")
        ->capture_default_str();
    cmd->add_option("--ops", o.ops, "ops to run: all_reduce reduce_scatter all_gather")
        ->capture_default_str();
    cmd->add_option("--reps", o.reps, "timed repetitions per size (median reported)")
        ->check(CLI::Range(1, 1000))
        ->capture_default_str();
    cmd->add_option("--warmup", o.warmup, "untimed repetitions first")
        ->check(CLI::Range(0, 100))
        ->capture_default_str();
    cmd->add_flag("--json", o.json, "one JSON object per line: memcpy, then each op and size");
    cmd->add_option("--config", o.config_file, "TOML config file (comm.* keys apply)");
    cmd->add_option("--set", o.sets, "key=value override, e.g. comm.verify=false");
    cmd->callback([] { run(o); });
}

}  // namespace apiary::cli
