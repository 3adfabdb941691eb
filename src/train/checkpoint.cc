#include "train/checkpoint.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <thread>
#include <utility>

#include "ckpt/safetensors.h"
#include "ckpt/sharded.h"
#include "core/error.h"
#include "core/timing.h"

namespace apiary::train {

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int64_t kMaxDim = int64_t(1) << 31;

// Step N from "step_<N>" (digits only), or -1.
int64_t step_of(const std::string& name) {
    if (name.rfind("step_", 0) != 0 || name.size() == 5 || name.size() > 5 + 18) return -1;
    int64_t v = 0;
    for (size_t i = 5; i < name.size(); ++i) {
        if (name[i] < '0' || name[i] > '9') return -1;
        v = v * 10 + (name[i] - '0');
    }
    return v;
}

bool complete(const fs::path& dir) {
    return fs::exists(dir / ckpt::kManifestFile) || fs::exists(dir / "meta.json");
}

// Removes step folders a crash left without their manifest.
void remove_partial_saves(const fs::path& ckpt_root) {
    if (!fs::is_directory(ckpt_root)) return;
    for (const auto& e : fs::directory_iterator(ckpt_root)) {
        if (!e.is_directory() || step_of(e.path().filename().string()) < 0) continue;
        if (!complete(e.path())) fs::remove_all(e.path());
    }
}

// Keeps the newest `keep` complete checkpoints at or before `step` (later
// ones belong to a timeline a resume abandoned: they are left alone and
// overwritten when the run gets there again).
void apply_retention(const std::string& run_dir, int64_t step, int64_t keep) {
    if (keep <= 0) return;
    int64_t kept = 0;
    for (const auto& [s, dir] : list_checkpoints(run_dir)) {
        if (s > step) continue;
        if (kept++ < keep) continue;
        fs::remove_all(dir);
    }
}

void barrier(comm::ProcessGroup& world, const char* what) {
    world.barrier({what, 0})->wait();
}

json layout_json(const parallel::ParallelLayout& l) {
    std::vector<int> counts;
    for (const auto& s : l.stage_blocks) counts.push_back(int(s.size()));
    return {{"dp", l.dp()},
            {"tp", l.tp()},
            {"pp", l.pp()},
            {"zero_stage", l.zero_stage},
            {"ep", l.ep},
            {"microbatches", l.microbatches},
            {"sequence_parallel", l.sequence_parallel},
            {"schedule", core::pipeline_schedule_name(l.schedule)},
            {"virtual_stages", l.virtual_stages},
            {"stage_layers", counts}};
}

}  // namespace

int64_t meta_int(const json& j, const std::string& key, int64_t lo, int64_t hi,
                 const std::string& where) {
    if (!j.is_object() || !j.contains(key)) {
        throw IoError(fmt::format("{}: '{}' is missing", where, key));
    }
    const json& v = j[key];
    const bool in_range = (v.is_number_unsigned() && v.get<uint64_t>() <= uint64_t(hi) &&
                           int64_t(v.get<uint64_t>()) >= lo) ||
                          (v.is_number_integer() && !v.is_number_unsigned() &&
                           v.get<int64_t>() >= lo && v.get<int64_t>() <= hi);
    if (!in_range) {
        throw IoError(fmt::format("{}: '{}' = {} is not an integer in [{}, {}]", where, key,
                                  v.dump(), lo, hi));
    }
    return v.get<int64_t>();
}

json spec_to_json(const core::ModelSpec& s) {
    json j = {{"arch", core::arch_name(s.arch)},
            {"n_layer", s.n_layer},
            {"n_embd", s.n_embd},
            {"n_head", s.n_head},
            {"n_kv_head", s.n_kv_head},
            {"vocab_size", s.vocab_size},
            {"max_seq_len", s.max_seq_len},
            {"ffn_hidden", s.ffn_dim()},
            {"tie_embeddings", s.tie_embeddings},
            {"norm_eps", s.norm_eps},
            {"rope_theta", s.rope_theta}};
    if (s.moe()) {
        // Mixture of experts: absent from dense checkpoints (older readers
        // never see it there).
        j["moe"] = {{"n_expert", s.n_expert},
                    {"n_expert_active", s.n_expert_active},
                    {"n_shared_expert", s.n_shared_expert},
                    {"moe_ffn_hidden", s.expert_ffn_dim()},
                    {"moe_dense_layers", s.moe_dense_layers},
                    {"router", s.moe_sigmoid ? "sigmoid" : "softmax"},
                    {"dropless", s.moe_dropless},
                    {"capacity_factor", s.moe_capacity_factor},
                    {"aux_loss_coef", s.moe_aux_loss_coef},
                    {"z_loss_coef", s.moe_z_loss_coef}};
    }
    return j;
}

core::ModelSpec spec_from_json(const json& j, const std::string& where) {
    const std::string w = where + " (model)";
    try {
        core::ModelSpec s;
        s.arch = core::parse_arch(j.at("arch").get<std::string>());
        s.n_layer = int(meta_int(j, "n_layer", 1, kMaxDim, w));
        s.n_embd = int(meta_int(j, "n_embd", 1, kMaxDim, w));
        s.n_head = int(meta_int(j, "n_head", 1, kMaxDim, w));
        s.n_kv_head = int(meta_int(j, "n_kv_head", 1, kMaxDim, w));
        s.vocab_size = int(meta_int(j, "vocab_size", 1, kMaxDim - 1, w));
        s.max_seq_len = int(meta_int(j, "max_seq_len", 1, kMaxDim, w));
        s.ffn_hidden = int(meta_int(j, "ffn_hidden", 1, kMaxDim, w));
        s.tie_embeddings = j.at("tie_embeddings").get<bool>();
        s.norm_eps = j.at("norm_eps").get<float>();
        s.rope_theta = j.at("rope_theta").get<float>();
        if (j.contains("moe")) {
            const json& m = j.at("moe");
            s.n_expert = int(meta_int(m, "n_expert", 1, kMaxDim, w));
            s.n_expert_active = int(meta_int(m, "n_expert_active", 1, kMaxDim, w));
            s.n_shared_expert = int(meta_int(m, "n_shared_expert", 0, kMaxDim, w));
            s.moe_ffn_hidden = int(meta_int(m, "moe_ffn_hidden", 1, kMaxDim, w));
            s.moe_dense_layers = int(meta_int(m, "moe_dense_layers", 0, kMaxDim, w));
            const std::string router = m.at("router").get<std::string>();
            if (router != "softmax" && router != "sigmoid") {
                throw IoError(fmt::format("{}: moe router '{}' (known: softmax, sigmoid)", w,
                                          router));
            }
            s.moe_sigmoid = router == "sigmoid";
            s.moe_dropless = m.at("dropless").get<bool>();
            s.moe_capacity_factor = m.at("capacity_factor").get<float>();
            s.moe_aux_loss_coef = m.at("aux_loss_coef").get<float>();
            s.moe_z_loss_coef = m.at("z_loss_coef").get<float>();
        }
        s.validate();
        return s;
    } catch (const json::exception& e) {
        throw IoError(fmt::format("{}: malformed model description: {}", where, e.what()));
    } catch (const ConfigError& e) {
        throw IoError(fmt::format("{}: {}", where, e.what()));
    }
}

namespace {

// AdamW's step count as the checkpoint records it.
int64_t optimizer_steps_of(const CheckpointRef& ck) {
    if (ck.version == 1) {
        // Version 1 kept it in optimizer.safetensors.
        const std::string path = (fs::path(ck.dir) / "optimizer.safetensors").string();
        const ckpt::SafetensorsFile f(path, true);
        const auto it = f.metadata().find("step_count");
        json j;
        if (it != f.metadata().end() && !it->second.empty() && it->second.size() < 19 &&
            it->second.find_first_not_of("0123456789") == std::string::npos) {
            j["step_count"] = std::stoll(it->second);
        }
        return meta_int(j, "step_count", 0, std::numeric_limits<int64_t>::max(), path);
    }
    const std::string where = ck.dir + "/" + ckpt::kManifestFile;
    return meta_int(ck.meta, "optimizer_steps", 0, std::numeric_limits<int64_t>::max(), where);
}

// This rank's chunks: its piece of every tensor of its shard; tensors every
// tensor-parallel rank holds whole are saved by the first, a tied
// embedding's second copy not at all. They point into the live buffers.
std::vector<ckpt::Chunk> rank_chunks(const parallel::Engine& engine) {
    const model::Transformer& m = engine.model();
    const parallel::DataParallel& dp = engine.data_parallel();
    const bool tp_first = engine.coord().tp == 0;
    std::vector<ckpt::Chunk> chunks;
    for (const auto& r : dp.saved_ranges()) {
        for (const auto& e : m.registry().entries()) {
            const int64_t lo = std::max(e.offset, r.begin), hi = std::min(e.offset + e.numel(), r.end);
            if (lo >= hi || e.tied_copy || (!e.split() && !tp_first)) continue;
            for (parallel::StateKind k : parallel::kStateKinds) {
                chunks.push_back({e.name, parallel::state_name(k), e.placement(), lo - e.offset,
                                  hi - lo, dp.state_at(k, lo)});
            }
        }
    }
    return chunks;
}

}  // namespace

struct CheckpointSaver::Pending {
    int64_t step = 0;
    json meta;  // the manifest's description, as of the snapshot
    std::string dir;
    std::vector<ckpt::Chunk> chunks;
    std::thread writer;
    std::atomic<bool> done{false};
    std::string part;  // this rank's manifest part (or {"error": ...}) once done
    Clock::time_point started;
    double stall_s = 0;
};

CheckpointSaver::CheckpointSaver(parallel::Engine& engine, std::string run_dir, SaveOptions options)
    : engine_(engine), run_dir_(std::move(run_dir)), options_(options) {
    if (options_.async) {
        // The snapshot buffer of async saves is taken now: its memory shows
        // from the first step (no surprise at the first save) and the
        // first save's stall is a copy like every other one's.
        int64_t floats = 0;
        for (const auto& c : rank_chunks(engine_)) floats += c.count;
        snapshot_ = core::Tensor({floats}, core::DType::f32, core::MemCategory::buffers);
    }
}

CheckpointSaver::~CheckpointSaver() {
    // Not committed: the manifest is missing, so the next save removes it.
    if (pending_ && pending_->writer.joinable()) pending_->writer.join();
}

void CheckpointSaver::save(int64_t step, const json& meta) {
    poll(true);  // at most one save in flight
    const auto t0 = Clock::now();
    comm::ProcessGroup& world = engine_.world();
    const fs::path root = fs::path(run_dir_) / "ckpt";
    auto p = std::make_unique<Pending>();
    p->step = step;
    // Everything the manifest says is taken now, with the snapshot: an
    // async save commits steps later, when the optimizer has moved on.
    p->meta = meta;
    p->meta["format"] = kCheckpointFormat;
    p->meta["version"] = kCheckpointVersion;
    p->meta["step"] = step;
    p->meta["model"] = spec_to_json(engine_.model().spec());
    p->meta["layout"] = layout_json(engine_.layout());
    p->meta["optimizer_steps"] = engine_.optimizer().step_count();
    p->started = t0;
    p->dir = (root / fmt::format("step_{:08d}", step)).string();
    if (engine_.main_rank()) {
        remove_partial_saves(root);
        // An older complete save of this step (a run resumed from before it)
        // becomes partial first, so a crash now cannot leave it half replaced.
        fs::remove(fs::path(p->dir) / ckpt::kManifestFile);
        fs::create_directories(p->dir);
    }
    barrier(world, "ckpt_dir");
    p->chunks = rank_chunks(engine_);
    if (options_.async) {
        // The training thread only copies this rank's part aside.
        int64_t floats = 0;
        for (const auto& c : p->chunks) floats += c.count;
        if (snapshot_.numel() != floats) {
            snapshot_ = core::Tensor({floats}, core::DType::f32, core::MemCategory::buffers);
        }
        float* at = snapshot_.f32();
        for (auto& c : p->chunks) {
            std::memcpy(at, c.data, size_t(c.count) * sizeof(float));
            c.data = at;
            at += c.count;
        }
    }
    auto write = [this, pp = p.get()] {
        try {
            const json part =
                options_.incremental
                    ? ckpt::write_chunks_incremental(
                          (fs::path(run_dir_) / "ckpt" / "blobs").string(), pp->chunks,
                          options_.piece_bytes)
                    : ckpt::write_chunks(
                          pp->dir, fmt::format("rank_{:05d}.safetensors", engine_.world_rank()),
                          pp->chunks);
            pp->part = part.dump();
        } catch (const std::exception& e) {
            pp->part =
                json{{"error", fmt::format("rank {}: {}", engine_.world_rank(), e.what())}}.dump();
        }
        pp->done.store(true);
    };
    pending_ = std::move(p);
    if (options_.async) {
        pending_->writer = std::thread(write);
        pending_->stall_s = core::seconds_since(t0);
        return;
    }
    write();
    pending_->stall_s = core::seconds_since(t0);
    commit();
}

bool CheckpointSaver::poll(bool wait) {
    if (!pending_) return false;
    if (wait && pending_->writer.joinable()) pending_->writer.join();
    // Every rank's write must be done: agreed by all ranks at the same call.
    int64_t done = pending_->done.load() ? 1 : 0;
    comm::ProcessGroup& world = engine_.world();
    world.all_reduce(&done, 1, core::DType::i64, comm::ReduceOp::sum, {"ckpt_done", 0})->wait();
    done = done == world.size() ? 1 : 0;
    if (!done) return false;
    if (pending_->writer.joinable()) pending_->writer.join();
    commit();
    return true;
}

void CheckpointSaver::commit() {
    comm::ProcessGroup& world = engine_.world();
    std::unique_ptr<Pending> p = std::move(pending_);
    const std::vector<std::string> parts = comm::all_gather_strings(world, p->part);
    SaveStats st;
    st.step = p->step;
    st.dir = p->dir;
    st.stall_s = p->stall_s;
    std::vector<json> parsed;
    for (const auto& text : parts) {
        parsed.push_back(json::parse(text));
        const json& j = parsed.back();
        if (j.contains("error") && st.error.empty()) st.error = j["error"].get<std::string>();
        st.bytes_written += j.value("bytes_written", j.value("bytes", uint64_t(0)));
        st.bytes_reused += j.value("bytes_reused", uint64_t(0));
    }
    if (engine_.main_rank()) {
        const fs::path root = fs::path(run_dir_) / "ckpt";
        if (!st.error.empty()) {
            // Nothing of this save is kept; `latest` still names the last good one.
            fs::remove_all(p->dir);
        } else {
            bool committed = false;
            try {
                ckpt::write_manifest(p->dir, parsed, p->meta);
                const std::string name = fs::path(p->dir).filename().string();
                ckpt::atomic_write((root / "latest").string(), name.data(), name.size());
                committed = true;
                apply_retention(run_dir_, p->step, options_.keep);
                if (options_.incremental) {
                    std::vector<std::string> kept;
                    for (const auto& [s, dir] : list_checkpoints(run_dir_)) kept.push_back(dir);
                    ckpt::remove_unreferenced_pieces((root / "blobs").string(), kept);
                }
            } catch (const std::exception& e) {
                if (committed) {
                    // `latest` names this save: only the clean-up of older ones failed.
                    fmt::print(stderr,
                               "apiary: warning: checkpoint of step {} saved, but removing "
                               "older checkpoints failed: {}\n",
                               p->step, e.what());
                } else {
                    st.error = e.what();
                    fs::remove_all(p->dir);
                }
            }
        }
        if (!st.error.empty()) {
            const LatestName prev = read_latest(run_dir_);
            const std::string kept = prev.problem.empty() ? prev.dir + " stays the latest"
                                     : prev.missing       ? "the run has no earlier checkpoint"
                                                          : prev.problem;
            fmt::print(stderr, "apiary: warning: the checkpoint of step {} failed ({}); {}\n",
                       p->step, st.error, kept);
        }
    }
    // The first rank's verdict (a manifest write may fail there only).
    int64_t failed = st.error.empty() ? 0 : 1;
    world.all_reduce(&failed, 1, core::DType::i64, comm::ReduceOp::max, {"ckpt_ok", 0})->wait();
    if (failed && st.error.empty()) st.error = "failed on another rank (see its log)";
    st.total_s = core::seconds_since(p->started);
    // A synchronous save holds training up until it is committed.
    if (!options_.async) st.stall_s = st.total_s;
    last_ = st;
}

std::string save_checkpoint(parallel::Engine& engine, const std::string& run_dir, int64_t step,
                            const json& meta, int64_t keep) {
    SaveOptions o;
    o.keep = keep;
    CheckpointSaver saver(engine, run_dir, o);
    saver.save(step, meta);
    if (!saver.last().error.empty()) {
        throw IoError(fmt::format("checkpoint of step {} failed: {}", step, saver.last().error));
    }
    return saver.last().dir;
}

void load_checkpoint(parallel::Engine& engine, const CheckpointRef& ck) {
    const ckpt::CheckpointReader reader(ck.dir);
    const model::Transformer& m = engine.model();
    parallel::DataParallel& dp = engine.data_parallel();
    const auto& ranges = dp.saved_ranges();
    // Reads [lo, hi) of tensor e's state `k` (hi <= the end of a range
    // this rank holds k for).
    auto read = [&](parallel::StateKind k, const model::ParamInfo& e, int64_t lo, int64_t hi) {
        if (lo >= hi) return;
        reader.read(parallel::state_name(k), e.name, e.placement(), lo - e.offset, hi - lo,
                    dp.state_at(k, lo));
    };
    // First this rank's saved ranges, in the order rank_chunks wrote them
    // (each tensor's parameter, m, v, then the next tensor) so that a
    // resume on the same layout reads its file front to back.
    for (const auto& r : ranges) {
        for (const auto& e : m.registry().entries()) {
            const int64_t lo = std::max(e.offset, r.begin), hi = std::min(e.offset + e.numel(), r.end);
            for (parallel::StateKind k : parallel::kStateKinds) read(k, e, lo, hi);
        }
    }
    // Then what this rank holds beyond them (whole parameters below ZeRO-3,
    // whole optimizer state below ZeRO-1), range by range: the ranges
    // ascend, so the gaps are between the end of one and the next's start.
    for (parallel::StateKind k : parallel::kStateKinds) {
        if (!dp.holds_whole(k)) continue;
        for (const auto& e : m.registry().entries()) {
            int64_t from = e.offset;
            const int64_t end = e.offset + e.numel();
            for (const auto& r : ranges) {
                const int64_t lo = std::max(e.offset, r.begin), hi = std::min(end, r.end);
                if (lo >= hi) continue;
                if (from < lo) read(k, e, from, lo);
                from = hi;
            }
            read(k, e, from, end);
        }
    }
    engine.params_loaded();
    engine.optimizer().set_step_count(optimizer_steps_of(ck));
}

void load_weights(const CheckpointRef& ck, model::Transformer& model) {
    const ckpt::CheckpointReader reader(ck.dir);
    float* params = model.params();
    for (const auto& e : model.registry().entries()) {
        reader.read("param", e.name, e.placement(), 0, e.numel(), params + e.offset);
    }
    for (const auto& name : reader.tensors("param")) {
        if (!model.registry().find(name)) {
            throw IoError(
                fmt::format("{}: tensor '{}' is not part of this model: the checkpoint "
                            "is of another model",
                            ck.dir, name));
        }
    }
}

std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& run_dir) {
    std::vector<std::pair<int64_t, std::string>> out;
    const fs::path root = fs::path(run_dir) / "ckpt";
    if (!fs::is_directory(root)) return out;
    for (const auto& e : fs::directory_iterator(root)) {
        const int64_t s = step_of(e.path().filename().string());
        if (s >= 0 && e.is_directory() && complete(e.path()))
            out.emplace_back(s, e.path().string());
    }
    std::sort(out.begin(), out.end(), std::greater<>());
    return out;
}

namespace {

CheckpointRef open_checked(const std::string& dir, bool full) {
    CheckpointRef ref;
    ref.dir = dir;
    const bool v1 =
        !fs::exists(fs::path(dir) / ckpt::kManifestFile) && fs::exists(fs::path(dir) / "meta.json");
    const std::string where = (fs::path(dir) / (v1 ? "meta.json" : ckpt::kManifestFile)).string();
    if (!fs::exists(where))
        throw IoError(fmt::format("{}: missing (checkpoint incomplete)", where));
    const ckpt::CheckpointReader reader(dir);
    ref.meta = reader.meta();
    if (!ref.meta.is_object() || ref.meta.value("format", "") != kCheckpointFormat) {
        throw IoError(fmt::format("{}: not an apiary checkpoint (format is not '{}')", where,
                                  kCheckpointFormat));
    }
    ref.version = int(meta_int(ref.meta, "version", 1, kCheckpointVersion, where));
    if (ref.version != (v1 ? 1 : 2)) {
        throw IoError(fmt::format("{}: version {} does not match its files", where, ref.version));
    }
    // Everything later reads must be present: a manifest without them is
    // damaged, and resuming from an unknown step would silently retrain.
    ref.step = meta_int(ref.meta, "step", 0, std::numeric_limits<int64_t>::max(), where);
    const int64_t named = step_of(fs::path(dir).filename().string());
    if (named >= 0 && named != ref.step) {
        throw IoError(fmt::format("{}: step {} but the folder is step {} (checkpoint damaged)",
                                  where, ref.step, named));
    }
    if (!ref.meta.contains("model") || !ref.meta["model"].is_object()) {
        throw IoError(fmt::format("{}: no 'model' description (checkpoint damaged)", where));
    }
    spec_from_json(ref.meta["model"], where);  // throws IoError if malformed
    if (reader.files().empty() && !reader.incremental()) {
        throw IoError(
            fmt::format("{}: no 'files' with sizes and checksums (checkpoint damaged, "
                        "or written before checkpoints were checksummed)",
                        where));
    }
    for (const auto& [name, rec] : reader.files().items()) {
        const fs::path path = fs::path(dir) / name;
        const int64_t bytes = meta_int(rec, "bytes", 0, std::numeric_limits<int64_t>::max(),
                                       where + " (files." + name + ")");
        if (!fs::is_regular_file(path)) {
            throw IoError(fmt::format("{}: missing (recorded in {})", path.string(), where));
        }
        if (int64_t(fs::file_size(path)) != bytes) {
            throw IoError(fmt::format("{}: {} bytes, but {} records {} (truncated or replaced)",
                                      path.string(), fs::file_size(path), where, bytes));
        }
    }
    if (full || v1) {
        reader.verify_files();
        if (reader.incremental()) reader.verify_chunks();  // every piece by its hash
    }
    return ref;
}

// Printable ASCII of a length a message can quote.
bool printable(const std::string& text) {
    return text.size() <= 80 &&
           std::all_of(text.begin(), text.end(), [](char c) { return c >= 0x20 && c < 0x7f; });
}

}  // namespace

CheckpointRef open_checkpoint(const std::string& dir, bool digests) {
    return open_checked(dir, digests);
}

void check_counters(const CheckpointRef& ck) {
    const std::string where =
        (fs::path(ck.dir) / (ck.version == 1 ? "meta.json" : ckpt::kManifestFile)).string();
    const json& m = ck.meta;
    constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
    int64_t skipped_steps = 0;
    if (m.contains("loss_scaler")) {
        skipped_steps =
            meta_int(m["loss_scaler"], "skipped_steps", 0, ck.step, where + " (loss_scaler)");
    }
    // Every step either updated the weights or was skipped for overflow.
    const int64_t optimizer_steps = optimizer_steps_of(ck);
    if (optimizer_steps != ck.step - skipped_steps) {
        throw IoError(
            fmt::format("{}: the optimizer has taken {} steps, but the checkpoint says step {} "
                        "with {} skipped (checkpoint damaged)",
                        where, optimizer_steps, ck.step, skipped_steps));
    }
    if (!m.contains("loader")) return;  // from before the loader's state was saved
    const int64_t loader_step = meta_int(m["loader"], "step", 0, kMax, where + " (loader)");
    // Each skipped batch the loader has passed is one batch more than steps.
    int64_t passed = 0;
    if (m.contains("skipped_batches")) {
        if (!m["skipped_batches"].is_array()) {
            throw IoError(
                fmt::format("{}: 'skipped_batches' is not a list of batch numbers "
                            "(checkpoint damaged)",
                            where));
        }
        for (const auto& b : m["skipped_batches"]) {
            if (!b.is_number_integer()) {
                throw IoError(fmt::format(
                    "{}: 'skipped_batches' holds {}, not a batch number (checkpoint damaged)",
                    where, b.dump()));
            }
            if (b.get<int64_t>() <= loader_step) ++passed;
        }
    }
    if (loader_step != ck.step + passed) {
        throw IoError(
            fmt::format("{}: the loader state is at batch {}, the checkpoint at step {} with {} "
                        "batches skipped (checkpoint damaged)",
                        where, loader_step, ck.step, passed));
    }
}

CheckpointRef verify_checkpoint(const std::string& dir) {
    CheckpointRef ck = open_checked(dir, true);  // every file's digest
    check_counters(ck);
    const ckpt::CheckpointReader reader(dir);
    if (!reader.incremental()) reader.verify_chunks();  // incremental: done above
    const std::string gap = reader.check_coverage();
    if (!gap.empty()) throw IoError(fmt::format("{}: {}", dir, gap));
    if (ck.version > 1) {
        for (const char* kind : {"adam_m", "adam_v"}) {
            for (const auto& name : reader.tensors("param")) {
                if (!reader.has(kind, name)) {
                    throw IoError(
                        fmt::format("{}: parameter '{}' has no {} state", dir, name, kind));
                }
            }
        }
    }
    return ck;
}

LatestName read_latest(const std::string& run_dir) {
    LatestName l;
    const fs::path root = fs::path(run_dir) / "ckpt", path = root / "latest";
    std::error_code ec;
    if (!fs::exists(path, ec)) {
        l.missing = true;
        l.problem = fmt::format("{}: missing", path.string());
        return l;
    }
    std::ifstream in(path, std::ios::binary);
    if (!in || fs::is_directory(path, ec)) {
        l.problem = fmt::format("{}: cannot be read as a file", path.string());
        return l;
    }
    // The saver writes the name alone; a first line is accepted too.
    char buf[256];
    in.read(buf, sizeof buf);
    std::string name(buf, size_t(in.gcount()));
    name = name.substr(0, name.find('\n'));
    l.step = step_of(name);
    if (name.empty()) {
        l.problem = fmt::format("{}: empty (it should name a folder step_N in {})", path.string(),
                                root.string());
    } else if (l.step < 0 && printable(name)) {
        l.problem = fmt::format("{}: names '{}', not a checkpoint folder step_N in {}",
                                path.string(), name, root.string());
    } else if (l.step < 0) {
        l.problem = fmt::format(
            "{}: holds {} bytes that are not the name of a checkpoint folder "
            "(step_N in {})",
            path.string(), name.size(), root.string());
    } else {
        l.dir = (root / name).string();
    }
    return l;
}

std::string continue_from(const std::string& run_dir, const LatestName& latest,
                          const CheckpointRef& good) {
    return fmt::format(
        "{}; {} (step {}) is intact, the newest that is: continue from it with `apiary train "
        "--resume {} --resume-from-previous-good` (or --auto-resume)",
        latest.missing           ? "the run's `latest` is missing"
        : latest.problem.empty() ? "the latest checkpoint is damaged"
                                 : "the run's `latest` does not name a checkpoint",
        good.dir, good.step, run_dir);
}

std::optional<CheckpointRef> newest_intact(const std::string& run_dir, int64_t below,
                                           std::vector<std::string>* why) {
    for (const auto& [s, dir] : list_checkpoints(run_dir)) {
        if (s >= below) continue;
        try {
            return verify_checkpoint(dir);
        } catch (const IoError& e) {
            if (why) why->push_back(e.what());
        }
    }
    return std::nullopt;
}

CheckpointRef latest_checkpoint(const std::string& run_dir, bool previous_good,
                                std::vector<std::string>* skipped) {
    if (!fs::is_directory(run_dir)) {
        throw IoError(fmt::format("{}: no such run directory", run_dir));
    }
    const LatestName latest = read_latest(run_dir);
    std::string damaged = latest.problem;
    if (damaged.empty()) {
        try {
            // Every checksum when asked to fall back (a chunk found damaged
            // while loading would be too late to); otherwise the cheap
            // checks here and each chunk's checksum as it is read.
            return previous_good ? verify_checkpoint(latest.dir) : open_checked(latest.dir, false);
        } catch (const IoError& e) {
            damaged = e.what();
        }
    }
    // With `latest` naming a step, only earlier ones: later ones belong to
    // a timeline a resume abandoned. Without, the newest of all.
    const int64_t below = latest.step >= 0 ? latest.step : std::numeric_limits<int64_t>::max();
    std::vector<std::string> why = {damaged};
    const std::optional<CheckpointRef> good = newest_intact(run_dir, below, &why);
    const fs::path root = fs::path(run_dir) / "ckpt";
    if (!good) {
        if (latest.missing && list_checkpoints(run_dir).empty()) {
            throw IoError(
                fmt::format("{}: no checkpoint (missing {}); the run has not saved one yet",
                            run_dir, (root / "latest").string()));
        }
        std::string msg = fmt::format("{}\nno {}intact checkpoint in {}", damaged,
                                      latest.step >= 0 ? "earlier " : "", root.string());
        for (size_t i = 1; i < why.size(); ++i) msg += "\n  " + why[i];
        throw IoError(msg);
    }
    if (!previous_good) throw IoError(damaged + "\n" + continue_from(run_dir, latest, *good));
    if (skipped) *skipped = why;
    return *good;
}

}  // namespace apiary::train
