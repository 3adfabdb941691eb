#include "train/checkpoint.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <utility>

#include "ckpt/safetensors.h"
#include "core/error.h"

namespace apiary::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kOptimizerFile = "optimizer.safetensors";
constexpr int64_t kMaxDim = int64_t(1) << 31;

std::string hex(uint64_t v) { return fmt::format("{:016x}", v); }

json digest_json(const ckpt::FileDigest& d) {
    return {{"bytes", d.bytes}, {"xxh64", hex(d.xxh64)}};
}

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

// Removes step folders a crash left without their meta.json.
void remove_partial_saves(const fs::path& ckpt_root) {
    if (!fs::is_directory(ckpt_root)) return;
    for (const auto& e : fs::directory_iterator(ckpt_root)) {
        if (!e.is_directory() || step_of(e.path().filename().string()) < 0) continue;
        if (!fs::exists(e.path() / "meta.json")) fs::remove_all(e.path());
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

// The recorded files of a checkpoint, checked against their digests.
void verify_files(const json& meta, const std::string& dir, const std::string& where) {
    if (!meta.contains("files") || !meta["files"].is_object() || meta["files"].empty()) {
        throw IoError(
            fmt::format("{}: no 'files' with sizes and checksums (checkpoint damaged, "
                        "or written before checkpoints were checksummed)",
                        where));
    }
    for (const auto& [name, rec] : meta["files"].items()) {
        if (name.empty() || name.find('/') != std::string::npos || name == "..") {
            throw IoError(fmt::format("{}: file name '{}' would leave the checkpoint directory",
                                      where, name));
        }
        const std::string path = (fs::path(dir) / name).string();
        const std::string field = "files." + name;
        if (!rec.is_object() || !rec.contains("xxh64") || !rec["xxh64"].is_string()) {
            throw IoError(fmt::format("{}: '{}' has no xxh64", where, field));
        }
        const int64_t bytes = meta_int(rec, "bytes", 0, std::numeric_limits<int64_t>::max(),
                                       where + " (" + field + ")");
        if (!fs::is_regular_file(path)) {
            throw IoError(fmt::format("{}: missing (recorded in {})", path, where));
        }
        const ckpt::FileDigest d = ckpt::digest_file(path);
        if (int64_t(d.bytes) != bytes) {
            throw IoError(fmt::format("{}: {} bytes, but {} records {} (truncated or replaced)",
                                      path, d.bytes, where, bytes));
        }
        if (hex(d.xxh64) != rec["xxh64"].get<std::string>()) {
            throw IoError(
                fmt::format("{}: xxh64 {} does not match {} recorded in {} (the file is "
                            "corrupted)",
                            path, hex(d.xxh64), rec["xxh64"].get<std::string>(), where));
        }
    }
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
    return {{"arch", core::arch_name(s.arch)},
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
        s.validate();
        return s;
    } catch (const json::exception& e) {
        throw IoError(fmt::format("{}: malformed model description: {}", where, e.what()));
    } catch (const ConfigError& e) {
        throw IoError(fmt::format("{}: {}", where, e.what()));
    }
}

std::string save_checkpoint(const std::string& run_dir, int64_t step, model::Transformer& model,
                            const OptimizerState& optimizer, const json& extra_meta,
                            const float* params, int64_t keep) {
    if (!params) params = std::as_const(model).params();
    const fs::path ckpt_root = fs::path(run_dir) / "ckpt";
    remove_partial_saves(ckpt_root);
    const std::string name = fmt::format("step_{:08d}", step);
    const fs::path dir = ckpt_root / name;
    // An older complete save of this step (a run resumed from before it)
    // becomes partial first, so a crash now cannot leave it half replaced.
    fs::remove(dir / "meta.json");
    fs::create_directories(dir);
    json files;
    std::vector<ckpt::TensorEntry> weights;
    for (const auto& e : model.registry().entries()) {
        weights.push_back(
            {e.name, "F32", e.shape, params + e.offset, size_t(e.numel()) * sizeof(float)});
    }
    const std::map<std::string, std::string> st_meta = {{"format", "pt"}, {"producer", "apiary"}};
    files[kModelFile] =
        digest_json(ckpt::write_safetensors((dir / kModelFile).string(), weights, st_meta));
    if (optimizer.m) {
        std::vector<ckpt::TensorEntry> state;
        for (const auto& e : model.registry().entries()) {
            const size_t nb = size_t(e.numel()) * sizeof(float);
            state.push_back({"m." + e.name, "F32", e.shape, optimizer.m + e.offset, nb});
            state.push_back({"v." + e.name, "F32", e.shape, optimizer.v + e.offset, nb});
        }
        files[kOptimizerFile] = digest_json(
            ckpt::write_safetensors((dir / kOptimizerFile).string(), state,
                                    {{"step_count", std::to_string(optimizer.step_count)}}));
    }
    json meta = extra_meta;
    meta["format"] = kCheckpointFormat;
    meta["version"] = kCheckpointVersion;
    meta["step"] = step;
    meta["model"] = spec_to_json(model.spec());
    meta["num_params"] = model.registry().num_params();
    meta["files"] = files;
    const std::string text = meta.dump(2) + "\n";
    ckpt::atomic_write((dir / "meta.json").string(), text.data(), text.size());
    ckpt::atomic_write((ckpt_root / "latest").string(), name.data(), name.size());
    apply_retention(run_dir, step, keep);
    return dir.string();
}

std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& run_dir) {
    std::vector<std::pair<int64_t, std::string>> out;
    const fs::path root = fs::path(run_dir) / "ckpt";
    if (!fs::is_directory(root)) return out;
    for (const auto& e : fs::directory_iterator(root)) {
        const int64_t s = step_of(e.path().filename().string());
        if (s >= 0 && e.is_directory() && fs::exists(e.path() / "meta.json")) {
            out.emplace_back(s, e.path().string());
        }
    }
    std::sort(out.begin(), out.end(), std::greater<>());
    return out;
}

CheckpointRef open_checkpoint(const std::string& dir) {
    CheckpointRef ref;
    ref.dir = dir;
    const fs::path meta_path = fs::path(dir) / "meta.json";
    const std::string where = meta_path.string();
    std::ifstream mi(meta_path);
    if (!mi) throw IoError(fmt::format("{}: missing (checkpoint incomplete)", where));
    try {
        ref.meta = json::parse(mi);
    } catch (const json::parse_error& e) {
        throw IoError(fmt::format("{}: not valid JSON (byte {})", where, e.byte));
    }
    if (!ref.meta.is_object() || ref.meta.value("format", "") != kCheckpointFormat) {
        throw IoError(fmt::format("{}: not an apiary checkpoint (format is not '{}')", where,
                                  kCheckpointFormat));
    }
    if (!ref.meta["version"].is_number_integer() ||
        ref.meta["version"].get<int64_t>() != kCheckpointVersion) {
        throw IoError(fmt::format("{}: checkpoint version {} is not supported (expected {})", where,
                                  ref.meta["version"].dump(), kCheckpointVersion));
    }
    // Everything later reads must be present: a meta.json without them is
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
    verify_files(ref.meta, dir, where);
    return ref;
}

CheckpointRef latest_checkpoint(const std::string& run_dir, bool previous_good,
                                std::vector<std::string>* skipped) {
    if (!fs::is_directory(run_dir)) {
        throw IoError(fmt::format("{}: no such run directory", run_dir));
    }
    const fs::path latest = fs::path(run_dir) / "ckpt" / "latest";
    std::ifstream in(latest);
    if (!in) {
        throw IoError(fmt::format("{}: no checkpoint (missing {}); the run has not saved one yet",
                                  run_dir, latest.string()));
    }
    std::string name;
    std::getline(in, name);
    if (step_of(name) < 0) {
        throw IoError(fmt::format("{}: names '{}', not a checkpoint directory (step_N)",
                                  latest.string(), name));
    }
    const std::string dir = (fs::path(run_dir) / "ckpt" / name).string();
    try {
        return open_checkpoint(dir);
    } catch (const IoError& damaged) {
        // The newest earlier checkpoint that is intact.
        std::vector<std::string> why = {damaged.what()};
        std::optional<CheckpointRef> good;
        for (const auto& [s, older] : list_checkpoints(run_dir)) {
            if (s >= step_of(name)) continue;
            try {
                good = open_checkpoint(older);
                break;
            } catch (const IoError& e) {
                why.push_back(e.what());
            }
        }
        if (!good) {
            throw IoError(fmt::format("{}\nno earlier intact checkpoint in {}", damaged.what(),
                                      (fs::path(run_dir) / "ckpt").string()));
        }
        if (!previous_good) {
            throw IoError(
                fmt::format("{}\nthe latest checkpoint is damaged; {} (step {}) is "
                            "intact: continue from it with `apiary train --resume {} "
                            "--resume-from-previous-good`",
                            damaged.what(), good->dir, good->step, run_dir));
        }
        if (skipped) *skipped = why;
        return *good;
    }
}

void load_weights(const CheckpointRef& ckpt, model::Transformer& model, float* dst) {
    if (!dst) dst = model.params();
    const std::string path = (fs::path(ckpt.dir) / kModelFile).string();
    const ckpt::SafetensorsFile file(path);
    for (const auto& e : model.registry().entries()) {
        if (!file.has(e.name)) {
            throw IoError(fmt::format("{}: no tensor '{}': the checkpoint is of another model",
                                      path, e.name));
        }
        file.read_f32(e.name, e.shape, dst + e.offset);
    }
    for (const auto& name : file.names()) {
        if (!model.registry().find(name)) {
            throw IoError(
                fmt::format("{}: tensor '{}' is not part of this model: the checkpoint "
                            "is of another model",
                            path, name));
        }
    }
}

int64_t load_optimizer_state(const CheckpointRef& ck, const model::Transformer& model, float* m,
                             float* v) {
    const std::string path = (fs::path(ck.dir) / kOptimizerFile).string();
    const ckpt::SafetensorsFile file(path);
    for (const auto& e : model.registry().entries()) {
        file.read_f32("m." + e.name, e.shape, m + e.offset);
        file.read_f32("v." + e.name, e.shape, v + e.offset);
    }
    const auto it = file.metadata().find("step_count");
    if (it == file.metadata().end()) {
        throw IoError(fmt::format("{}: metadata has no step_count", path));
    }
    try {
        size_t used = 0;
        const int64_t n = std::stoll(it->second, &used);
        if (used != it->second.size() || n < 0) throw std::invalid_argument(it->second);
        return n;
    } catch (const std::exception&) {
        throw IoError(fmt::format("{}: step_count '{}' is not a count", path, it->second));
    }
}

}  // namespace apiary::train
