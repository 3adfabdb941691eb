// `apiary ckpt export RUN --format hf --out DIR` writes a checkpoint's
// weights as a Hugging Face model directory (hf_format.h); `apiary ckpt
// import HF_DIR --out RUN` makes such a directory a new run at step 0,
// which `apiary generate` samples from and `apiary train --resume`
// continues: the weights with zero AdamW state, written by the same
// sharded-checkpoint writer as every save, and a loader state at the start
// of the data the run's config names, prepared at import so that a resume
// finds the state it expects (train/trainer.cc, restore_data).

#include "train/hf.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <utility>

#include "ckpt/hf_format.h"
#include "ckpt/safetensors.h"
#include "ckpt/sharded.h"
#include "core/error.h"
#include "data/file_io.h"
#include "data/loader.h"
#include "data/tokenizer.h"
#include "model/model.h"
#include "train/run_dir.h"
#include "train/train_data.h"

namespace apiary::train {

namespace fs = std::filesystem;
using nlohmann::json;
namespace hf = ckpt::hf;

namespace {

constexpr const char* kEndOfText = "<|endoftext|>";

std::string meta_string(const json& meta, const char* key) {
    const auto it = meta.find(key);
    return it != meta.end() && it->is_string() ? it->get<std::string>() : "";
}

struct RunTokenizer {
    std::string text;
    std::optional<uint32_t> eos;  // <|endoftext|>, config.json's bos and eos
};

// The run's tokenizer.json when the checkpoint was trained with it: the
// hash the checkpoint recorded must match.
std::optional<RunTokenizer> run_tokenizer(const train::CheckpointRef& ck) {
    if (meta_string(ck.meta, "tokenizer") != train::kTokenizerFile) return std::nullopt;
    const fs::path path = fs::path(ck.dir).parent_path().parent_path() / train::kTokenizerFile;
    if (!fs::is_regular_file(path)) {
        fmt::print(stderr, "apiary: warning: {} is missing; exporting without a tokenizer\n",
                   path.string());
        return std::nullopt;
    }
    std::string text = data::read_file(path.string());
    const auto tok = data::Tokenizer::from_json_text(text, path.string());
    const std::string want = meta_string(ck.meta, "tokenizer_hash");
    if (!want.empty() && data::hex64(tok.hash()) != want) {
        throw DataError(fmt::format("{}: tokenizer hash {}, but {} was trained with {}",
                                    path.string(), data::hex64(tok.hash()), ck.dir, want));
    }
    RunTokenizer r{std::move(text), std::nullopt};
    if (tok.has_special(kEndOfText)) r.eos = tok.special_id(kEndOfText);
    return r;
}

// An export's directory: new, empty, or holding only what an earlier
// export wrote (replaced), so that no other file is mixed with the model.
void check_export_dir(const fs::path& dir) {
    if (!fs::exists(dir)) return;
    if (!fs::is_directory(dir)) {
        throw IoError(
            fmt::format("{}: exists and is not a directory (--format hf writes a "
                        "directory of config.json and model.safetensors)",
                        dir.string()));
    }
    for (const auto& e : fs::directory_iterator(dir)) {
        const std::string name = e.path().filename().string();
        if (name != hf::kConfigFile && name != hf::kWeightsFile && name != train::kTokenizerFile) {
            throw IoError(
                fmt::format("{}: holds '{}', which an export does not write; give a "
                            "new or empty directory",
                            dir.string(), name));
        }
    }
}

}  // namespace

HfExport export_hf(const CheckpointRef& ck, const std::string& out) {
    const fs::path dir(out);
    check_export_dir(dir);
    const std::string where = (fs::path(ck.dir) / ckpt::kManifestFile).string();
    const core::ModelSpec spec = train::spec_from_json(ck.meta.at("model"), where);
    if (spec.moe()) {
        throw ConfigError(fmt::format(
            "{}: a mixture-of-experts model (model.n_expert = {}) has no Hugging Face export "
            "yet (GPT2LMHeadModel and LlamaForCausalLM have no experts); its checkpoint holds "
            "every expert by name (`apiary ckpt inspect`)",
            ck.dir, spec.n_expert));
    }
    const std::optional<RunTokenizer> tokenizer = run_tokenizer(ck);
    const ckpt::CheckpointReader reader(ck.dir);
    const std::vector<std::string> names = reader.tensors("param");
    std::vector<std::vector<float>> data;
    std::vector<ckpt::TensorEntry> entries;
    data.reserve(names.size());
    int64_t params = 0;
    for (const auto& name : names) {
        const std::vector<int64_t> shape = reader.global_shape("param", name);
        core::Placement whole;
        whole.global_shape = whole.local_shape = shape;
        std::vector<float> v(size_t(whole.local_numel()));
        reader.read("param", name, whole, 0, whole.local_numel(), v.data());
        if (hf::is_conv1d(spec.arch, name)) v = hf::transposed(v, shape[0], shape[1]);
        params += int64_t(v.size());
        data.push_back(std::move(v));
        entries.push_back({hf::hf_name(spec.arch, name), "F32",
                           hf::hf_shape(spec.arch, name, shape), data.back().data(),
                           data.back().size() * sizeof(float)});
    }
    fs::create_directories(dir);
    ckpt::write_safetensors((dir / hf::kWeightsFile).string(), entries,
                            {{"format", "pt"}, {"producer", "apiary"}});
    const std::string config =
        hf::config_json(spec, tokenizer ? tokenizer->eos : std::nullopt).dump(2) + "\n";
    ckpt::atomic_write((dir / hf::kConfigFile).string(), config.data(), config.size());
    const fs::path tok_path = dir / train::kTokenizerFile;
    if (tokenizer) {
        ckpt::atomic_write(tok_path.string(), tokenizer->text.data(), tokenizer->text.size());
    } else {
        fs::remove(tok_path);  // an earlier export's, of another run
    }
    return {spec, entries.size(), params, tokenizer.has_value()};
}

namespace {

struct ImportArgs {
    std::string hf_dir, out;
    bool overwrite = false;
};

// A tied LM head that a file stores anyway must be the embedding.
void check_tied_head(const hf::Checkpoint& ck, const std::string& name,
                     const std::vector<float>& embedding, const std::vector<int64_t>& shape) {
    if (ck.read(name, shape) != embedding) {
        throw DataError(
            fmt::format("{}: tensor '{}' differs from the token embedding, but config.json says "
                        "tie_word_embeddings = true; set it to false if the head is its own matrix",
                        ck.file_of(name), name));
    }
}

// The weights in apiary's layout, one per registry entry, each checked
// against the shape config.json implies; a tensor the model lacks is an
// error (the file is of another model, or config.json does not describe it).
std::vector<std::vector<float>> read_weights(const hf::Checkpoint& ck, const model::Transformer& m,
                                             const std::string& hf_dir) {
    const core::ModelSpec& spec = m.spec();
    const core::Arch arch = spec.arch;
    // Files saved from GPT2Model (the original "gpt2" upload) have no prefix.
    const std::string prefix =
        ck.has("wte.weight") && !ck.has("transformer.wte.weight") ? "" : "transformer.";
    std::set<std::string> used;
    std::vector<std::vector<float>> out;
    for (const auto& e : m.registry().entries()) {
        const std::string name = hf::hf_name(arch, e.name, prefix);
        const std::vector<int64_t> shape = hf::hf_shape(arch, e.name, e.global_shape);
        if (!ck.has(name)) {
            throw DataError(fmt::format(
                "{}: tensor '{}' (shape [{}]) is missing from {}, but config.json describes a "
                "{} that has it",
                hf_dir, name, fmt::join(shape, ", "), ck.description(), hf::architecture(arch)));
        }
        std::vector<float> v = ck.read(name, shape);
        if (hf::is_conv1d(arch, e.name)) v = hf::transposed(v, shape[0], shape[1]);
        used.insert(name);
        out.push_back(std::move(v));
    }
    for (const auto& name : ck.names()) {
        if (used.count(name) || hf::is_buffer(arch, name)) continue;
        if (spec.tie_embeddings && name == "lm_head.weight") {
            const auto& embedding = m.registry().entries().front();  // registered first
            check_tied_head(ck, name, out.front(), embedding.global_shape);
            continue;
        }
        throw DataError(fmt::format(
            "{}: tensor '{}' is not part of a {} with this config.json ({} layers, width {}): "
            "the weights are of another model, or config.json does not describe them",
            ck.file_of(name), name, hf::architecture(arch), spec.n_layer, spec.n_embd));
    }
    return out;
}

// The value a config key holds, as the type of `v`.
core::Value current(const core::Config& c, const std::string& key, const core::Value& v) {
    if (std::holds_alternative<int64_t>(v)) return c.get_int(key);
    if (std::holds_alternative<double>(v)) return c.get_real(key);
    return c.get_string(key);
}

// Reals compared as the float the model keeps.
bool same_value(core::Value a, core::Value b) {
    for (core::Value* v : {&a, &b}) {
        if (auto* d = std::get_if<double>(v)) *d = double(float(*d));
    }
    return a == b;
}

// model.* as config.json describes the model; every other key from
// --config and --set, or its default.
void set_model_keys(core::Config& c, const core::ModelSpec& s, const std::string& where) {
    const std::vector<std::pair<std::string, core::Value>> keys = {
        {"model.arch", std::string(core::arch_name(s.arch))},
        {"model.n_layer", int64_t(s.n_layer)},
        {"model.n_embd", int64_t(s.n_embd)},
        {"model.n_head", int64_t(s.n_head)},
        {"model.n_kv_head", int64_t(s.n_kv_head)},
        {"model.vocab_size", int64_t(s.vocab_size)},
        {"model.max_seq_len", int64_t(s.max_seq_len)},
        {"model.ffn_hidden", int64_t(s.ffn_dim())},
        {"model.tie_embeddings", std::string(s.tie_embeddings ? "true" : "false")},
        {"model.norm_eps", hf::shortest(s.norm_eps)},
        {"model.rope_theta", hf::shortest(s.rope_theta)}};
    for (const auto& [key, v] : keys) {
        if (c.is_set(key) && !same_value(current(c, key, v), v)) {
            throw ConfigError(fmt::format(
                "{} = {} (from {}), but {} describes the model with {}; model.* come from the "
                "imported config.json: leave it out",
                key, core::value_to_string(current(c, key, v)), c.source(key), where,
                core::value_to_string(v)));
        }
        c.set_value(key, v, where);
    }
    if (train::spec_to_json(core::model_spec_from(c)) != train::spec_to_json(s)) {
        throw ConfigError(
            fmt::format("model.preset = '{}' (from {}) sets fields {} does not (head width, "
                        "experts); leave model.preset out",
                        c.get_string("model.preset"), c.source("model.preset"), where));
    }
}

// The imported model's tokenizer: --tokenizer, else HF_DIR/tokenizer.json
// when there is one; "" for none.
std::string model_tokenizer(const std::string& hf_dir, const std::string& tokenizer) {
    if (!tokenizer.empty()) {
        if (!fs::is_regular_file(tokenizer)) {
            throw IoError(fmt::format("--tokenizer {}: no such file", tokenizer));
        }
        return fs::absolute(tokenizer).string();
    }
    const fs::path own = fs::path(hf_dir) / train::kTokenizerFile;
    return fs::is_regular_file(own) ? fs::absolute(own).string() : "";
}

// The run's config: --config and --set, model.* from config.json, the
// data tokenized with the model's tokenizer (unless data.* name one), and
// a train.seq_len within the model's positions.
core::Config import_config(core::Config c, const ImportArgs& a, const core::ModelSpec& spec,
                           const std::string& where, const std::string& tokenizer) {
    set_model_keys(c, spec, where);
    c.set_value("run.dir", a.out, "--out");
    const bool bytes = c.get_string("data.tokenizer") == "byte";
    if (!bytes && c.get_string("data.tokenizer_file").empty()) {
        if (tokenizer.empty()) {
            throw ConfigError(fmt::format(
                "{} has no tokenizer.json: give the model's tokenizer with --tokenizer FILE "
                "(or --set data.tokenizer=byte for a model of raw bytes, or name the run's data "
                "with data.sources and data.tokenizer_file); a new tokenizer trained on "
                "data.corpus would not match the weights",
                a.hf_dir));
        }
        c.set_value("data.tokenizer_file", tokenizer, "--tokenizer");
    }
    const int64_t T = c.get_int("train.seq_len");
    if (T > spec.max_seq_len) {
        if (c.is_set("train.seq_len")) {
            throw ConfigError(
                fmt::format("train.seq_len = {} (from {}) exceeds the model's {} "
                            "positions ({}); lower it",
                            T, c.source("train.seq_len"), spec.max_seq_len, where));
        }
        c.set_value("train.seq_len", int64_t(spec.max_seq_len), where);
    }
    return c;
}

struct RunData {
    train::TrainData data;
    json loader;  // the training loader's state before step 1
};

// The data the run will train on, prepared as `apiary train` prepares it,
// and the loader state a resume restores: the start of that stream.
RunData import_data(const core::Config& c, const core::ModelSpec& spec,
                    const std::string& tokenizer) {
    RunData r{train::resolve_train_data(c, true), {}};
    const train::TrainData& d = r.data;
    if (!tokenizer.empty()) {
        const std::string hash = data::hex64(data::Tokenizer::load(tokenizer).hash());
        if (hash != d.tokenizer_hash) {
            throw DataError(fmt::format(
                "{}: the model's tokenizer has hash {}, but the run's data ({}) is tokenized "
                "with {}; train it on data of the model's tokenizer",
                tokenizer, hash, d.manifest, d.tokenizer_hash));
        }
    }
    if (d.vocab_size > spec.vocab_size) {
        throw DataError(
            fmt::format("{}: the data's tokenizer has {} tokens, more than the "
                        "model's vocab_size = {}",
                        d.manifest, d.vocab_size, spec.vocab_size));
    }
    auto o = data::LoaderOptions::from_config(c, 0, 1, "train");
    o.sources = d.sources;
    o.tokenizer_hash = d.tokenizer_hash;
    o.prefetch = 0;
    r.loader = data::Loader(o).state();
    return r;
}

// ckpt/step_00000000: one rank's file with every parameter and zero AdamW
// moments, the manifest with what train::open_checkpoint checks and a
// resume reads, then ckpt/latest; the writer of every save.
std::string write_checkpoint(const std::string& run_dir, const model::Transformer& m,
                             const std::vector<std::vector<float>>& weights, json meta) {
    const fs::path root = fs::path(run_dir) / "ckpt";
    const std::string name = fmt::format("step_{:08d}", 0);
    const fs::path dir = root / name;
    fs::create_directories(dir);
    size_t largest = 0;
    for (const auto& w : weights) largest = std::max(largest, w.size());
    const std::vector<float> zeros(largest, 0.0f);
    std::vector<ckpt::Chunk> chunks;
    const auto& entries = m.registry().entries();
    for (size_t i = 0; i < entries.size(); ++i) {
        const core::Placement place = entries[i].placement();
        for (const char* kind : {"param", "adam_m", "adam_v"}) {
            const float* src = std::string(kind) == "param" ? weights[i].data() : zeros.data();
            chunks.push_back({entries[i].name, kind, place, 0, entries[i].numel(), src});
        }
    }
    const json part = ckpt::write_chunks(dir.string(), "rank_00000.safetensors", chunks);
    meta["format"] = train::kCheckpointFormat;
    meta["version"] = train::kCheckpointVersion;
    meta["step"] = 0;
    meta["model"] = train::spec_to_json(m.spec());
    meta["optimizer_steps"] = 0;
    ckpt::write_manifest(dir.string(), {part}, meta);
    ckpt::atomic_write((root / "latest").string(), name.data(), name.size());
    return dir.string();
}

std::string write_run(const ImportArgs& a, const core::Config& c, const model::Transformer& m,
                      const std::vector<std::vector<float>>& weights, const RunData& r,
                      const std::string& source) {
    train::RunDirLock lock(a.out);
    train::clear_run_dir(a.out);  // --overwrite checked before anything was read
    const fs::path run(a.out);
    const std::string toml = c.to_toml();
    ckpt::atomic_write((run / "config.toml").string(), toml.data(), toml.size());
    const std::string& tok = r.data.tokenizer_json;
    if (!tok.empty()) {
        ckpt::atomic_write((run / train::kTokenizerFile).string(), tok.data(), tok.size());
    }
    // A run directory has its log, if only to be recognised as one.
    ckpt::atomic_write((run / train::kMetricsFile).string(), "", 0);
    const json meta = {{"tokenizer", tok.empty() ? "" : train::kTokenizerFile},
                       {"tokenizer_hash", r.data.tokenizer_hash},
                       {"loader", r.loader},
                       {"config_hash", fmt::format("{:016x}", c.hash())},
                       {"precision", c.get_string("train.precision")},
                       // Hugging Face's model was trained up to its positions.
                       {"seq_len", m.spec().max_seq_len},
                       {"tokens", 0},
                       {"imported_from", {{"dir", a.hf_dir}, {"files", source}}}};
    return write_checkpoint(a.out, m, weights, meta);
}

// --out: new or empty, or with --overwrite a run directory (as
// train::check_new_run_dir decides for `apiary train`).
void check_out_dir(const ImportArgs& a) {
    const bool empty = !fs::exists(a.out) || (fs::is_directory(a.out) && fs::is_empty(a.out));
    if (!empty && !a.overwrite) {
        throw ConfigError(
            fmt::format("--out {}: already exists and is not empty; give a new "
                        "directory, or --overwrite to replace the run in it",
                        a.out));
    }
    train::check_new_run_dir(a.out, a.overwrite);
}

}  // namespace

HfModel open_hf_model(const std::string& hf_dir, const std::string& tokenizer) {
    if (!fs::is_directory(hf_dir)) {
        throw IoError(
            fmt::format("{}: no such directory (give a Hugging Face model directory: "
                        "config.json and model.safetensors)",
                        hf_dir));
    }
    const std::string where = (fs::path(hf_dir) / hf::kConfigFile).string();
    const core::ModelSpec spec = hf::spec_from_config(hf::read_config_json(where), where);
    return {hf_dir, where, spec, model_tokenizer(hf_dir, tokenizer)};
}

HfImport import_hf(const HfModel& model, core::Config config, const std::string& out,
                   bool overwrite) {
    const ImportArgs a{model.dir, out, overwrite};
    const core::ModelSpec& spec = model.spec;
    const std::string& tokenizer = model.tokenizer;
    const core::Config c = import_config(std::move(config), a, spec, model.config_path, tokenizer);
    check_out_dir(a);
    const hf::Checkpoint ck(a.hf_dir);
    model::ModelOptions o;
    o.storage = model::Storage::sharded;  // the registry, without buffers
    const model::Transformer m(spec, 1, 1, o);
    const std::vector<std::vector<float>> weights = read_weights(ck, m, a.hf_dir);
    const RunData r = import_data(c, spec, tokenizer);
    return {ck.description(), write_run(a, c, m, weights, r, ck.description())};
}

}  // namespace apiary::train
