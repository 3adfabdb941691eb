#include "train/checkpoint.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "ckpt/safetensors.h"
#include "core/error.h"

namespace apiary::train {

namespace fs = std::filesystem;
using nlohmann::json;

json spec_to_json(const core::ModelSpec& s) {
    return {{"arch", core::arch_name(s.arch)}, {"n_layer", s.n_layer}, {"n_embd", s.n_embd},
            {"n_head", s.n_head}, {"n_kv_head", s.n_kv_head}, {"vocab_size", s.vocab_size},
            {"max_seq_len", s.max_seq_len}, {"ffn_hidden", s.ffn_dim()},
            {"tie_embeddings", s.tie_embeddings}, {"norm_eps", s.norm_eps},
            {"rope_theta", s.rope_theta}};
}

core::ModelSpec spec_from_json(const json& j, const std::string& where) {
    try {
        core::ModelSpec s;
        s.arch = core::parse_arch(j.at("arch").get<std::string>());
        s.n_layer = j.at("n_layer").get<int>();
        s.n_embd = j.at("n_embd").get<int>();
        s.n_head = j.at("n_head").get<int>();
        s.n_kv_head = j.at("n_kv_head").get<int>();
        s.vocab_size = j.at("vocab_size").get<int>();
        s.max_seq_len = j.at("max_seq_len").get<int>();
        s.ffn_hidden = j.at("ffn_hidden").get<int>();
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
                            const float* params) {
    if (!params) params = std::as_const(model).params();
    const fs::path ckpt_root = fs::path(run_dir) / "ckpt";
    const std::string name = fmt::format("step_{:08d}", step);
    const fs::path dir = ckpt_root / name;
    fs::create_directories(dir);
    std::vector<ckpt::TensorEntry> weights;
    for (const auto& e : model.registry().entries()) {
        weights.push_back({e.name, "F32", e.shape, params + e.offset,
                           size_t(e.numel()) * sizeof(float)});
    }
    const std::map<std::string, std::string> st_meta = {{"format", "pt"},
                                                        {"producer", "apiary"}};
    ckpt::write_safetensors((dir / "model.safetensors").string(), weights, st_meta);
    if (optimizer.m) {
        std::vector<ckpt::TensorEntry> state;
        for (const auto& e : model.registry().entries()) {
            const size_t nb = size_t(e.numel()) * sizeof(float);
            state.push_back({"m." + e.name, "F32", e.shape, optimizer.m + e.offset, nb});
            state.push_back({"v." + e.name, "F32", e.shape, optimizer.v + e.offset, nb});
        }
        ckpt::write_safetensors((dir / "optimizer.safetensors").string(), state,
                                {{"step_count", std::to_string(optimizer.step_count)}});
    }
    json meta = extra_meta;
    meta["format"] = kCheckpointFormat;
    meta["version"] = kCheckpointVersion;
    meta["step"] = step;
    meta["model"] = spec_to_json(model.spec());
    meta["num_params"] = model.registry().num_params();
    const std::string text = meta.dump(2) + "\n";
    ckpt::atomic_write((dir / "meta.json").string(), text.data(), text.size());
    ckpt::atomic_write((ckpt_root / "latest").string(), name.data(), name.size());
    return dir.string();
}

CheckpointRef latest_checkpoint(const std::string& run_dir) {
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
    if (name.find('/') != std::string::npos || name.find("..") != std::string::npos ||
        name.empty()) {
        throw IoError(fmt::format("{}: names '{}', not a checkpoint directory", latest.string(),
                                  name));
    }
    CheckpointRef ref;
    ref.dir = (fs::path(run_dir) / "ckpt" / name).string();
    const fs::path meta_path = fs::path(ref.dir) / "meta.json";
    std::ifstream mi(meta_path);
    if (!mi) throw IoError(fmt::format("{}: missing (checkpoint incomplete)", meta_path.string()));
    try {
        ref.meta = json::parse(mi);
    } catch (const json::parse_error& e) {
        throw IoError(fmt::format("{}: not valid JSON (byte {})", meta_path.string(), e.byte));
    }
    if (!ref.meta.is_object() || ref.meta.value("format", "") != kCheckpointFormat) {
        throw IoError(fmt::format("{}: not an apiary checkpoint (format is not '{}')",
                                  meta_path.string(), kCheckpointFormat));
    }
    if (ref.meta.value("version", 0) != kCheckpointVersion) {
        throw IoError(fmt::format("{}: checkpoint version {} is not supported (expected {})",
                                  meta_path.string(), ref.meta.value("version", 0),
                                  kCheckpointVersion));
    }
    // Everything later reads must be present: a meta.json without them is
    // damaged, and resuming from an unknown step would silently retrain.
    if (!ref.meta.contains("step") || !ref.meta["step"].is_number_integer() ||
        ref.meta["step"].get<int64_t>() < 0) {
        throw IoError(fmt::format("{}: no valid 'step' (checkpoint damaged)", meta_path.string()));
    }
    if (!ref.meta.contains("model") || !ref.meta["model"].is_object()) {
        throw IoError(fmt::format("{}: no 'model' description (checkpoint damaged)",
                                  meta_path.string()));
    }
    spec_from_json(ref.meta["model"], meta_path.string());  // throws IoError if malformed
    ref.step = ref.meta["step"].get<int64_t>();
    return ref;
}

void load_weights(const CheckpointRef& ckpt, model::Transformer& model, float* dst) {
    if (!dst) dst = model.params();
    const std::string path = (fs::path(ckpt.dir) / "model.safetensors").string();
    const ckpt::SafetensorsFile file(path);
    for (const auto& e : model.registry().entries()) {
        if (!file.has(e.name)) {
            throw IoError(fmt::format("{}: no tensor '{}': the checkpoint is of another model",
                                      path, e.name));
        }
        file.read_f32(e.name, e.shape, dst + e.offset);
    }
}

int64_t load_optimizer_state(const CheckpointRef& ck, const model::Transformer& model, float* m,
                             float* v) {
    const std::string path = (fs::path(ck.dir) / "optimizer.safetensors").string();
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
        return std::stoll(it->second);
    } catch (const std::exception&) {
        throw IoError(fmt::format("{}: step_count '{}' is not a number", path, it->second));
    }
}

}  // namespace apiary::train
