// `apiary bench ckpt`: checkpoint throughput against the disk. In one run,
// on the same directory: save and load GB/s of a preset's full training
// state (parameters and AdamW's m and v) beside `dd` writing (conv=fsync, a
// new file each time, the bytes the save wrote) and reading the same file,
// --reps saves each between two dd runs; the training stall of an async save
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

#include "ckpt/file_writer.h"
#include "cli/bench_comm.h"
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
    int batch = 4, seq = 1024, steps = 8, threads = 0, reps = 3;
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

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
}

// dd's input: the files of `saved` (the rank's file first) one after
// another, repeated or cut to `bytes`.
void write_dd_input(const fs::path& saved, uint64_t bytes, const fs::path& out) {
    std::vector<fs::path> files = {saved / "rank_00000.safetensors"};
    for (const auto& e : fs::directory_iterator(saved)) {
        if (e.is_regular_file() && e.path() != files[0]) files.push_back(e.path());
    }
    std::ofstream o(out, std::ios::binary);
    std::vector<char> buf(size_t(1) << 20);
    for (uint64_t left = bytes; left > 0;) {
        const uint64_t before = left;
        for (size_t i = 0; i < files.size() && left > 0; ++i) {
            std::ifstream in(files[i], std::ios::binary);
            while (left > 0) {
                in.read(buf.data(), std::streamsize(std::min<uint64_t>(buf.size(), left)));
                if (in.gcount() <= 0) break;
                o.write(buf.data(), in.gcount());
                left -= uint64_t(in.gcount());
            }
        }
        if (left == before) throw IoError(fmt::format("bench ckpt: {} is empty", saved.string()));
    }
    if (!o.flush()) throw IoError(fmt::format("bench ckpt: cannot write {}", out.string()));
}

// One synchronous save against dd: the save's seconds and phases, and the
// mean of the dd runs before and after it.
struct SaveRep {
    double save_s = 0, dd_s = 0;
    ckpt::WriteTimes wt;
};

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
    // A first save gives the bytes a save writes (every file of it) and
    // dd's input: the saved files one after another, cut or repeated to
    // exactly that many bytes (this checkpoint's bytes: a virtual disk may
    // store zeros for free), read once so that dd reads it from the page
    // cache as the save reads memory.
    ckpt::reset_write_times();
    const std::string first = train::save_checkpoint(*engine, (root / "first").string(), 1, meta);
    const uint64_t bytes = uint64_t(ckpt::write_times().bytes);
    const fs::path dd_in = root / "dd-input.bin";
    write_dd_input(first, bytes, dd_in);
    fs::remove_all(root / "first");
    timed(fmt::format("cat {} > /dev/null", dd_in.string()));
    // Each save sits between two dd runs (this disk's rate drifts: the mean
    // of both is its reference), every one of them writing a new file after
    // `sync`, so that none pays for another's writes; dd's file is removed,
    // and the save's folder, before the next one.
    std::vector<SaveRep> reps;
    std::string saved;
    int dd_runs = 0;
    auto dd = [&] {
        const fs::path out = root / fmt::format("dd-{}.bin", dd_runs++);
        timed("sync");
        const double s =
            timed(fmt::format("dd if={} of={} bs=1M conv=fsync", dd_in.string(), out.string()));
        APIARY_CHECK(fs::file_size(out) == bytes, "bench ckpt: dd wrote {} bytes of {}",
                     fs::file_size(out), bytes);
        fs::remove(out);
        return s;
    };
    double dd_before = dd();
    for (int r = 0; r < a.reps; ++r) {
        if (!saved.empty()) fs::remove_all(root / fmt::format("run-{}", r - 1));
        timed("sync");
        ckpt::reset_write_times();
        const auto t_save = Clock::now();
        saved =
            train::save_checkpoint(*engine, (root / fmt::format("run-{}", r)).string(), 1, meta);
        SaveRep rep;
        rep.save_s = since(t_save);
        rep.wt = ckpt::write_times();
        const double dd_after = dd();
        rep.dd_s = 0.5 * (dd_before + dd_after);
        dd_before = dd_after;
        reps.push_back(rep);
    }
    std::vector<double> ratios;
    for (const auto& r : reps) ratios.push_back(r.dd_s / r.save_s);
    const SaveRep& mid = *std::find_if(reps.begin(), reps.end(), [&](const SaveRep& r) {
        return r.dd_s / r.save_s == median(ratios);
    });
    const double save_s = mid.save_s, dd_write_s = mid.dd_s;
    const ckpt::WriteTimes& wt = mid.wt;
    fs::remove(dd_in);
    const bool cold = drop_caches();
    const auto t_load = Clock::now();
    // As a resume reads it: the cheap checks up front, each chunk's checksum
    // as it is read (open_checkpoint would also hash every file first).
    train::load_checkpoint(
        *engine,
        train::latest_checkpoint((root / fmt::format("run-{}", a.reps - 1)).string(), false));
    const double load_s = since(t_load);
    const fs::path dd_read = fs::path(saved) / "rank_00000.safetensors";
    const uint64_t read_bytes = fs::file_size(dd_read);
    drop_caches();
    const double dd_read_s = timed(fmt::format("dd if={} of=/dev/null bs=1M", dd_read.string()));

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
                      {"dd_write_gb_per_s", gb / dd_write_s},
                      {"save_vs_dd", dd_write_s / save_s},
                      {"save_vs_dd_reps", ratios},
                      {"load_gb_per_s", double(read_bytes) / 1e9 / load_s},
                      {"dd_read_gb_per_s", double(read_bytes) / 1e9 / dd_read_s},
                      {"load_vs_dd", dd_read_s / load_s},
                      {"reads_from_disk", cold},
                      {"step_s", median(step_s)},
                      {"step_during_write_s", median(busy_step_s)},
                      {"async_saves", stall_s.size()},
                      {"async_cost_per_save_s", async_cost},
                      {"sync_save_s", save_s},
                      {"save_breakdown_s",
                       {{"in_file_writes", wt.total_s},
                        {"write_calls", wt.write_s},
                        {"hash_other_thread", wt.hash_s},
                        {"wait_for_hash", wt.hash_wait_s},
                        {"start_writeback", wt.writeback_s},
                        {"wait_and_drop_window", wt.wait_drop_s},
                        {"fsync_and_rename", wt.sync_s},
                        {"outside_file_writes", save_s - wt.total_s}}},
                      {"save_files", wt.files},
                      {"save_files_windowed", wt.windowed_files},
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
    for (size_t r = 0; r < reps.size(); ++r) {
        fmt::print(
            "  save {}: {:.2f} s, {:.2f} GB/s; dd conv=fsync (mean of the runs around it) "
            "{:.2f} s, {:.2f} GB/s: {:.0f}% of dd\n",
            r + 1, reps[r].save_s, gb / reps[r].save_s, reps[r].dd_s, gb / reps[r].dd_s,
            100 * ratios[r]);
    }
    fmt::print("  save {:.2f} GB/s, dd conv=fsync {:.2f} GB/s: {:.0f}% of dd (the median of {})\n",
               out["save_gb_per_s"].get<double>(), out["dd_write_gb_per_s"].get<double>(),
               100 * out["save_vs_dd"].get<double>(), reps.size());
    // The writing thread's phases add up to the file writes' time; the
    // hashing thread runs beside them.
    fmt::print(
        "  save {:.2f} s (the median): {} files ({} through windows) {:.2f} s, other "
        "(manifest, directories) {:.2f} s\n"
        "    writing thread: write calls {:.2f} s, starting writeback {:.2f} s, waiting for "
        "the previous window and dropping it {:.2f} s, waiting for the hash {:.2f} s, fsync "
        "and rename {:.2f} s; hashing thread {:.2f} s\n",
        save_s, wt.files, wt.windowed_files, wt.total_s, save_s - wt.total_s, wt.write_s,
        wt.writeback_s, wt.wait_drop_s, wt.hash_wait_s, wt.sync_s, wt.hash_s);
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
    cmd->add_option("--reps", a.reps, "synchronous saves timed, each between two dd runs")
        ->check(CLI::Range(1, 100))
        ->capture_default_str();
    cmd->add_option("--threads", a.threads, "threads (0: all cores)")->capture_default_str();
    cmd->add_flag("--json", a.json, "one JSON object");
    cmd->callback([] { bench_ckpt(a); });
}

}  // namespace apiary::cli
