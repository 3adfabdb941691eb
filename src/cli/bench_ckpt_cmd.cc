// `apiary bench ckpt`: checkpoint throughput against the disk. In one run,
// on the same directory: save and load GB/s of a preset's full training
// state (parameters and AdamW's m and v) beside `dd` writing (conv=fsync)
// and reading the same number of bytes; the training stall of an async save
// as a fraction of a step (the default step is GPT-2's: sequences of
// 1,024 tokens), and all it costs training; and the bytes an incremental save writes in a
// fine-tuning run whose blocks are frozen but the last. --json prints one
// object.

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/bench_comm.h"
#include "ckpt/file_writer.h"
#include "cli/command.h"
#include "core/error.h"
#include "core/model_spec.h"
#include "core/rng.h"
#include "core/threads.h"
#include "parallel/engine.h"
#include "parallel/layout.h"
#include "train/checkpoint.h"

namespace apiary::cli {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

struct CkptArgs {
    std::string preset = "gpt2-124m";
    std::string dir = ".bench-ckpt";
    int batch = 4, seq = 1024, steps = 8, threads = 0;
    bool json = false;
};

double since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Drops the page cache (root only), so that reads come from the disk.
bool drop_caches() {
    ::sync();
    std::ofstream f("/proc/sys/vm/drop_caches");
    if (!f) return false;
    f << "3\n";
    return bool(f);
}

// Seconds `cmd` takes (a shell command).
double timed(const std::string& cmd) {
    const auto t0 = Clock::now();
    if (std::system((cmd + " > /dev/null 2>&1").c_str()) != 0) {
        throw IoError(fmt::format("bench ckpt: `{}` failed", cmd));
    }
    return since(t0);
}

uint64_t dir_bytes(const fs::path& dir) {
    uint64_t n = 0;
    for (const auto& e : fs::recursive_directory_iterator(dir)) {
        if (e.is_regular_file()) n += e.file_size();
    }
    return n;
}

std::unique_ptr<parallel::Engine> make_engine(const core::ModelSpec& spec, const CkptArgs& a,
                                              std::vector<std::string> freeze = {}) {
    parallel::EngineOptions o;
    o.freeze = std::move(freeze);
    auto e = std::make_unique<parallel::Engine>(spec, parallel::one_rank_layout(spec), nullptr,
                                                a.batch, a.seq, o);
    e->init(1);
    return e;
}

void bench_ckpt(const CkptArgs& a) {
    core::set_num_threads(a.threads);
    const core::ModelSpec& spec = core::preset(a.preset);
    // A directory of its own inside --dir: nothing already there is touched.
    const fs::path root =
        fs::absolute(a.dir) / fmt::format("apiary-bench-ckpt-{}", static_cast<long>(::getpid()));
    fs::create_directories(root);
    std::vector<int32_t> rows(size_t(a.batch) * size_t(a.seq + 1));
    const core::Philox rng(3, 0);
    for (size_t i = 0; i < rows.size(); ++i) rows[i] = int32_t(rng.below(i, spec.vocab_size));
    const json meta = json::object();

    // Save and load of the whole state, against dd on the same disk.
    auto engine = make_engine(spec, a);
    engine->train_step(rows.data(), a.batch, a.seq, 1e-4, false);
    // A first save gives the size; the timed one sits between two dd runs
    // of that size (this disk's rate drifts: the mean of both is the
    // reference), each after `sync` so that none pays for another's writes.
    // dd copies the first save's file (in the page cache), not zeros: a
    // virtual disk may store zeros for free.
    const std::string first = train::save_checkpoint(*engine, (root / "first").string(), 1, meta);
    const uint64_t bytes = dir_bytes(first);
    const int64_t mib = int64_t((bytes + (1 << 20) - 1) >> 20);
    const std::string dd = fmt::format("dd if={} of={} bs=1M conv=fsync",
                                       (fs::path(first) / "rank_00000.safetensors").string(),
                                       (root / "dd.bin").string());
    timed("sync");
    double dd_write_s = timed(dd);
    timed("sync");
    ckpt::reset_write_times();
    const auto t_save = Clock::now();
    const std::string saved = train::save_checkpoint(*engine, (root / "run").string(), 1, meta);
    const double save_s = since(t_save);
    const ckpt::WriteTimes wt = ckpt::write_times();
    timed("sync");
    dd_write_s = 0.5 * (dd_write_s + timed(dd));
    const bool cold = drop_caches();
    const auto t_load = Clock::now();
    // As a resume reads it: the cheap checks up front, each chunk's checksum
    // as it is read (open_checkpoint would also hash every file first).
    train::load_checkpoint(*engine, train::latest_checkpoint((root / "run").string(), false));
    const double load_s = since(t_load);
    drop_caches();
    const double dd_read_s =
        timed(fmt::format("dd if={} of=/dev/null bs=1M", (root / "dd.bin").string()));

    // An async save's stall against the step it interrupts: a save starts
    // whenever none is in flight (a save begun while one is still writing
    // waits for it, which measures the disk, not the stall); steps that
    // overlap a background write are timed apart from quiet ones.
    std::vector<double> step_s, busy_step_s, stall_s;
    {
        train::SaveOptions so;
        so.async = true;
        train::CheckpointSaver saver(*engine, (root / "async").string(), so);
        for (int s = 0; s < a.steps; ++s) {
            const bool busy = saver.in_flight();
            const auto t0 = Clock::now();
            engine->train_step(rows.data(), a.batch, a.seq, 1e-4, false);
            (busy ? busy_step_s : step_s).push_back(since(t0));
            saver.poll(false);
            if (s > 0 && !saver.in_flight()) {
                const auto t1 = Clock::now();
                saver.save(s + 1, meta);
                stall_s.push_back(since(t1));
            }
        }
        saver.poll(true);
    }
    // Fine-tuning the last block and the final norm only: the second
    // incremental save writes those (with their AdamW state) alone.
    std::vector<std::string> frozen = {"wte.", "wpe.", "model.embed_tokens."};
    for (int l = 0; l + 1 < spec.n_layer; ++l) {
        frozen.push_back(fmt::format("h.{}.", l));
        frozen.push_back(fmt::format("model.layers.{}.", l));
    }
    auto tuned = make_engine(spec, a, frozen);
    train::SaveOptions inc;
    inc.incremental = true;
    train::CheckpointSaver saver(*tuned, (root / "inc").string(), inc);
    tuned->train_step(rows.data(), a.batch, a.seq, 1e-4, false);
    saver.save(1, meta);
    tuned->train_step(rows.data(), a.batch, a.seq, 1e-4, false);
    saver.save(2, meta);
    const auto& st = saver.last();
    fs::remove_all(root);

    auto median = [](std::vector<double> v) {
        std::sort(v.begin(), v.end());
        return v.empty() ? 0.0 : v[v.size() / 2];
    };
    const double gb = double(bytes) / 1e9;
    // What an async save costs training in all: its stall, plus what the
    // steps that overlap its background write lose to it.
    double async_cost = 0;
    for (double x : stall_s) async_cost += x;
    for (double x : busy_step_s) async_cost += x - median(step_s);
    if (!stall_s.empty()) async_cost /= double(stall_s.size());
    const json out = {{"preset", a.preset},
                      {"checkpoint_bytes", bytes},
                      {"save_gb_per_s", gb / save_s},
                      {"dd_write_gb_per_s", double(mib << 20) / 1e9 / dd_write_s},
                      {"save_vs_dd", (gb / save_s) / (double(mib << 20) / 1e9 / dd_write_s)},
                      {"load_gb_per_s", gb / load_s},
                      {"dd_read_gb_per_s", double(mib << 20) / 1e9 / dd_read_s},
                      {"load_vs_dd", (gb / load_s) / (double(mib << 20) / 1e9 / dd_read_s)},
                      {"reads_from_disk", cold},
                      {"step_s", median(step_s)},
                      {"step_during_write_s", median(busy_step_s)},
                      {"async_saves", stall_s.size()},
                      {"async_cost_per_save_s", async_cost},
                      {"sync_save_s", save_s},
                      {"save_breakdown_s",
                       {{"in_file_writes", wt.total_s},
                        {"copy_and_hash_parts", wt.copy_hash_s},
                        {"wait_for_free_block", wt.wait_s},
                        {"hash_file_other_thread", wt.file_hash_s},
                        {"write_calls", wt.write_s},
                        {"start_writeback", wt.writeback_s},
                        {"fsync_and_rename", wt.sync_s},
                        {"outside_file_writes", save_s - wt.total_s}}},
                      {"save_files", wt.files},
                      {"save_files_direct", wt.direct_files},
                      {"async_stall_s", median(stall_s)},
                      {"async_stall_fraction_of_step", median(stall_s) / median(step_s)},
                      {"incremental_bytes_written", st.bytes_written},
                      {"incremental_bytes_reused", st.bytes_reused},
                      {"incremental_written_fraction",
                       double(st.bytes_written) / double(st.bytes_written + st.bytes_reused)}};
    if (a.json) {
        fmt::print("{}\n", out.dump());
        return;
    }
    fmt::print("bench ckpt: {} ({:.2f} GB of parameters and AdamW state) in {}\n", a.preset, gb,
               root.parent_path().string());
    fmt::print("  save {:.2f} GB/s, dd conv=fsync {:.2f} GB/s: {:.0f}% of dd\n",
               out["save_gb_per_s"].get<double>(), out["dd_write_gb_per_s"].get<double>(),
               100 * out["save_vs_dd"].get<double>());
    fmt::print(
        "  save {:.2f} s: in {} file writes {:.2f} s ({} with O_DIRECT), other (manifest, "
        "directories) {:.2f} s\n"
        "    per thread: copy and hash parts {:.2f} s, waiting for a free block {:.2f} s, "
        "file hash {:.2f} s, write calls {:.2f} s, starting writeback {:.2f} s, fsync and "
        "rename {:.2f} s\n",
        save_s, wt.files, wt.total_s, wt.direct_files, save_s - wt.total_s, wt.copy_hash_s,
        wt.wait_s, wt.file_hash_s, wt.write_s, wt.writeback_s, wt.sync_s);
    fmt::print("  load {:.2f} GB/s, dd {:.2f} GB/s: {:.0f}% of dd{}\n",
               out["load_gb_per_s"].get<double>(), out["dd_read_gb_per_s"].get<double>(),
               100 * out["load_vs_dd"].get<double>(), cold ? "" : " (page cache: not root)");
    fmt::print("  async save stalls a step for {:.4f} s of {:.3f} s: {:.1f}%\n", median(stall_s),
               median(step_s), 100 * median(stall_s) / median(step_s));
    fmt::print(
        "  a step overlapping the background write: {:.3f} s ({:+.1f}%); all told an "
        "async save costs {:.2f} s of training, a synchronous one {:.2f} s ({} saves)\n",
        median(busy_step_s), 100 * (median(busy_step_s) / median(step_s) - 1), async_cost, save_s,
        stall_s.size());
    fmt::print(
        "  incremental, all but the last block frozen: {:.1f} MB written, {:.1f} MB "
        "reused ({:.1f}%)\n",
        double(st.bytes_written) / 1e6, double(st.bytes_reused) / 1e6,
        100 * out["incremental_written_fraction"].get<double>());
}

}  // namespace

void add_bench_ckpt_command(CLI::App* bench) {
    auto* cmd = bench->add_subcommand(
        "ckpt", "checkpoint save/load GB/s beside dd, async stall, incremental bytes");
    static CkptArgs a;
    cmd->add_option("--preset", a.preset, "model preset")->capture_default_str();
    cmd->add_option(
           "--dir", a.dir,
           "directory on the disk to measure (a subdirectory is made there and removed after)")
        ->capture_default_str();
    cmd->add_option("--batch", a.batch, "micro-batch of the timed steps")->capture_default_str();
    cmd->add_option("--seq", a.seq, "sequence length")->capture_default_str();
    cmd->add_option("--steps", a.steps, "steps of the async measurement")->capture_default_str();
    cmd->add_option("--threads", a.threads, "threads (0: all cores)")->capture_default_str();
    cmd->add_flag("--json", a.json, "one JSON object");
    cmd->callback([] { bench_ckpt(a); });
}

}  // namespace apiary::cli
