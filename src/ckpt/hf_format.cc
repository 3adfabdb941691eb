#include "ckpt/hf_format.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string_view>

#include "core/error.h"
#include "core/tensor.h"

namespace apiary::ckpt::hf {

namespace fs = std::filesystem;
using core::Arch;
using nlohmann::json;

namespace {

bool ends_with(const std::string& s, std::string_view tail) {
    return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// config[key], or null when absent (transformers then uses its default).
const json& field(const json& c, const char* key) {
    static const json null;
    const auto it = c.find(key);
    return it == c.end() ? null : *it;
}

// An integer field in [lo, hi] (the ranges of apiary's model.* keys).
int int_field(const json& c, const char* key, int64_t fallback, int64_t lo, int64_t hi,
              const std::string& where) {
    const json& v = field(c, key);
    if (v.is_null()) return int(fallback);
    const bool ok = v.is_number_integer() &&
                    (v.is_number_unsigned() ? v.get<uint64_t>() <= uint64_t(hi)
                                            : v.get<int64_t>() >= lo && v.get<int64_t>() <= hi) &&
                    v.get<int64_t>() >= lo;
    if (!ok) {
        throw DataError(fmt::format("{}: '{}' = {} is not an integer in [{}, {}]", where, key,
                                    v.dump(), lo, hi));
    }
    return int(v.get<int64_t>());
}

// A positive finite number.
float real_field(const json& c, const char* key, double fallback, const std::string& where) {
    const json& v = field(c, key);
    if (v.is_null()) return float(fallback);
    if (!v.is_number() || !(v.get<double>() > 0) || !std::isfinite(float(v.get<double>()))) {
        throw DataError(
            fmt::format("{}: '{}' = {} is not a positive number", where, key, v.dump()));
    }
    return float(v.get<double>());
}

bool bool_field(const json& c, const char* key, bool fallback, const std::string& where) {
    const json& v = field(c, key);
    if (v.is_null()) return fallback;
    if (!v.is_boolean()) {
        throw DataError(fmt::format("{}: '{}' = {} is not true or false", where, key, v.dump()));
    }
    return v.get<bool>();
}

std::string string_field(const json& c, const char* key, const std::string& fallback,
                         const std::string& where) {
    const json& v = field(c, key);
    if (v.is_null()) return fallback;
    if (!v.is_string()) {
        throw DataError(fmt::format("{}: '{}' = {} is not a string", where, key, v.dump()));
    }
    return v.get<std::string>();
}

[[noreturn]] void unsupported(const std::string& where, const std::string& what) {
    throw DataError(
        fmt::format("{}: {}: apiary's model has no such feature, so the weights "
                    "would not compute the same function",
                    where, what));
}

// The shape fields both configs have: their names in config.json and
// transformers' defaults for them.
struct IntField {
    const char* name;
    int64_t fallback;
};
struct ShapeFields {
    IntField vocab, positions, width, layers, heads;
    const char *ffn, *eps;
    double eps_default;
    bool tied_default;
};
const ShapeFields kGpt2Fields = {.vocab = {"vocab_size", 50257},
                                 .positions = {"n_positions", 1024},
                                 .width = {"n_embd", 768},
                                 .layers = {"n_layer", 12},
                                 .heads = {"n_head", 12},
                                 .ffn = "n_inner",
                                 .eps = "layer_norm_epsilon",
                                 .eps_default = 1e-5,
                                 .tied_default = true};
const ShapeFields kLlamaFields = {.vocab = {"vocab_size", 32000},
                                  .positions = {"max_position_embeddings", 2048},
                                  .width = {"hidden_size", 4096},
                                  .layers = {"num_hidden_layers", 32},
                                  .heads = {"num_attention_heads", 32},
                                  .ffn = "intermediate_size",
                                  .eps = "rms_norm_eps",
                                  .eps_default = 1e-6,
                                  .tied_default = false};

// The ranges are those of apiary's model.* keys, so the run's config.toml
// reads back.
core::ModelSpec shape_from(const json& c, Arch arch, const ShapeFields& f, const std::string& w) {
    auto get = [&](const IntField& i, int64_t lo, int64_t hi) {
        return int_field(c, i.name, i.fallback, lo, hi, w);
    };
    core::ModelSpec s;
    s.arch = arch;
    s.vocab_size = get(f.vocab, 2, 1 << 24);
    s.max_seq_len = get(f.positions, 1, 1 << 22);
    s.n_embd = get(f.width, 1, 1 << 20);
    s.n_layer = get(f.layers, 1, 1000);
    s.n_head = s.n_kv_head = get(f.heads, 1, 4096);
    // GPT-2's n_inner defaults to 4C, LLaMA's intermediate_size to 11008.
    s.ffn_hidden =
        int_field(c, f.ffn, arch == Arch::gpt2 ? 4 * int64_t(s.n_embd) : 11008, 1, 1 << 22, w);
    s.norm_eps = real_field(c, f.eps, f.eps_default, w);
    s.tie_embeddings = bool_field(c, "tie_word_embeddings", f.tied_default, w);
    return s;
}

// transformers' GPT2Config.
core::ModelSpec gpt2_spec(const json& c, const std::string& w) {
    const core::ModelSpec s = shape_from(c, Arch::gpt2, kGpt2Fields, w);
    // gelu_pytorch_tanh is the same tanh approximation as gelu_new.
    const std::string act = string_field(c, "activation_function", "gelu_new", w);
    if (act != "gelu_new" && act != "gelu_pytorch_tanh") {
        unsupported(w, fmt::format("activation_function '{}' (apiary's GPT-2 uses 'gelu_new', "
                                   "the tanh approximation)",
                                   act));
    }
    if (!bool_field(c, "scale_attn_weights", true, w)) {
        unsupported(w, "scale_attn_weights = false (unscaled attention)");
    }
    if (bool_field(c, "scale_attn_by_inverse_layer_idx", false, w)) {
        unsupported(w, "scale_attn_by_inverse_layer_idx = true");
    }
    return s;
}

// RoPE without scaling: rope_scaling null (or of type "default"), and
// rope_theta at the top level or, in newer files, in rope_parameters.
float llama_rope_theta(const json& c, const std::string& w) {
    for (const char* key : {"rope_scaling", "rope_parameters"}) {
        const json& r = field(c, key);
        if (r.is_null()) continue;
        const std::string type =
            r.is_object() ? r.value("rope_type", r.value("type", std::string("default"))) : "?";
        if (type != "default") unsupported(w, fmt::format("{} = {}", key, r.dump()));
        if (r.contains("rope_theta")) return real_field(r, "rope_theta", 10000.0, w);
    }
    return real_field(c, "rope_theta", 10000.0, w);
}

// transformers' LlamaConfig.
core::ModelSpec llama_spec(const json& c, const std::string& w) {
    core::ModelSpec s = shape_from(c, Arch::llama, kLlamaFields, w);
    s.n_kv_head = int_field(c, "num_key_value_heads", s.n_head, 1, 4096, w);
    s.rope_theta = llama_rope_theta(c, w);
    const std::string act = string_field(c, "hidden_act", "silu", w);
    if (act != "silu") unsupported(w, fmt::format("hidden_act '{}' (apiary's uses 'silu')", act));
    for (const char* key : {"attention_bias", "mlp_bias"}) {
        if (bool_field(c, key, false, w)) unsupported(w, fmt::format("{} = true", key));
    }
    if (s.n_head > 0 && s.n_embd % s.n_head == 0) {
        const int hd = int_field(c, "head_dim", s.n_embd / s.n_head, 1, 1 << 16, w);
        if (hd != s.n_embd / s.n_head) {
            unsupported(w, fmt::format("head_dim = {} (not hidden_size / num_attention_heads = {})",
                                       hd, s.n_embd / s.n_head));
        }
    }
    return s;
}

}  // namespace

double shortest(float f) { return std::strtod(fmt::format("{}", f).c_str(), nullptr); }

const char* architecture(Arch arch) {
    return arch == Arch::gpt2 ? "GPT2LMHeadModel" : "LlamaForCausalLM";
}

bool is_conv1d(Arch arch, const std::string& name) {
    if (arch != Arch::gpt2) return false;
    for (const char* tail :
         {".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight"}) {
        if (ends_with(name, tail)) return true;
    }
    return false;
}

std::string hf_name(Arch arch, const std::string& name, const std::string& gpt2_prefix) {
    return arch == Arch::gpt2 && name != "lm_head.weight" ? gpt2_prefix + name : name;
}

std::vector<int64_t> hf_shape(Arch arch, const std::string& name, std::vector<int64_t> shape) {
    if (is_conv1d(arch, name)) std::swap(shape[0], shape[1]);
    return shape;
}

bool is_buffer(Arch arch, const std::string& name) {
    if (arch == Arch::gpt2) return ends_with(name, ".attn.bias") || ends_with(name, ".masked_bias");
    return ends_with(name, ".rotary_emb.inv_freq");
}

std::vector<float> transposed(const std::vector<float>& a, int64_t rows, int64_t cols) {
    // In 16 x 16 tiles, writing along output rows: a plain loop writes (or
    // reads) with a stride of a whole row, often a multiple of 4 KiB, so
    // every access misses the cache (measured on 3072 x 768: 10 ns per
    // element plain, 0.7 ns tiled; BENCHMARKS.md).
    constexpr int64_t kTile = 16;
    std::vector<float> t(a.size());
    for (int64_t r0 = 0; r0 < rows; r0 += kTile) {
        for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
            const int64_t r1 = std::min(rows, r0 + kTile), c1 = std::min(cols, c0 + kTile);
            for (int64_t c = c0; c < c1; ++c) {
                for (int64_t r = r0; r < r1; ++r) t[size_t(c * rows + r)] = a[size_t(r * cols + c)];
            }
        }
    }
    return t;
}

json config_json(const core::ModelSpec& s, std::optional<uint32_t> eos) {
    const json special = eos ? json(*eos) : json(nullptr);
    json c = {{"architectures", json::array({architecture(s.arch)})},
              {"model_type", core::arch_name(s.arch)},
              {"vocab_size", s.vocab_size},
              {"tie_word_embeddings", s.tie_embeddings},
              {"bos_token_id", special},
              {"eos_token_id", special},
              {"initializer_range", 0.02},
              {"use_cache", true},
              {"torch_dtype", "float32"}};
    const ShapeFields& f = s.arch == Arch::gpt2 ? kGpt2Fields : kLlamaFields;
    c.update({{f.positions.name, s.max_seq_len},
              {f.width.name, s.n_embd},
              {f.layers.name, s.n_layer},
              {f.heads.name, s.n_head},
              {f.ffn, s.ffn_dim()},
              {f.eps, shortest(s.norm_eps)}});
    if (s.arch == Arch::gpt2) {
        // apiary trains without dropout.
        c.update({{"n_ctx", s.max_seq_len},
                  {"activation_function", "gelu_new"},
                  {"resid_pdrop", 0.0},
                  {"embd_pdrop", 0.0},
                  {"attn_pdrop", 0.0},
                  {"scale_attn_weights", true},
                  {"scale_attn_by_inverse_layer_idx", false},
                  {"reorder_and_upcast_attn", false}});
    } else {
        c.update({{"num_key_value_heads", s.n_kv_head},
                  {"head_dim", s.head_size()},
                  {"hidden_act", "silu"},
                  {"rope_theta", shortest(s.rope_theta)},
                  {"rope_scaling", nullptr},
                  {"attention_bias", false},
                  {"attention_dropout", 0.0},
                  {"mlp_bias", false},
                  {"pretraining_tp", 1}});
    }
    return c;
}

core::ModelSpec spec_from_config(const json& c, const std::string& where) {
    if (!c.is_object()) throw DataError(fmt::format("{}: not a JSON object", where));
    const std::string type = string_field(c, "model_type", "", where);
    core::ModelSpec s;
    if (type == "gpt2") {
        s = gpt2_spec(c, where);
    } else if (type == "llama") {
        s = llama_spec(c, where);
    } else {
        throw DataError(fmt::format(
            "{}: model_type {} is not supported; apiary imports 'gpt2' (GPT2LMHeadModel) and "
            "'llama' (LlamaForCausalLM)",
            where, type.empty() ? "is missing, so it" : "'" + type + "'"));
    }
    try {
        s.validate();
    } catch (const ConfigError& e) {
        throw DataError(fmt::format("{}: {} (as apiary's model keys)", where, e.what()));
    }
    return s;
}

json read_config_json(const std::string& path) {
    // config.json is small; a device or a huge file is refused unread.
    constexpr uintmax_t kMaxConfigBytes = uintmax_t(16) << 20;
    std::error_code ec;
    const auto st = fs::status(path, ec);
    if (fs::exists(st) && !fs::is_regular_file(st)) {
        throw IoError(
            fmt::format("{}: not a regular file (a device, pipe or directory, or a "
                        "symlink to one): put the model's config.json there",
                        path));
    }
    if (fs::exists(st) && fs::file_size(path, ec) > kMaxConfigBytes) {
        throw IoError(fmt::format("{}: {} bytes, more than the {} bytes a config.json may have",
                                  path, fs::file_size(path, ec), kMaxConfigBytes));
    }
    std::ifstream in(path);
    if (!in) {
        throw IoError(
            fmt::format("{}: missing (a Hugging Face model directory holds config.json "
                        "and model.safetensors)",
                        path));
    }
    try {
        return json::parse(in);
    } catch (const json::parse_error& e) {
        throw IoError(fmt::format("{}: not valid JSON (byte {})", path, e.byte));
    }
}

namespace {

// An index lists one line per tensor: a few hundred KiB for the largest
// models; read whole, so bounded.
constexpr uintmax_t kMaxIndexBytes = uintmax_t(64) << 20;

// A name that is there but is no regular file (a symlink to a device, a
// directory, a pipe) is named as such, never as missing: a device would
// give no size to check lengths against, or endless bytes.
void refuse_if_not_regular(const fs::path& p) {
    std::error_code ec;
    const fs::file_status link = fs::symlink_status(p, ec);
    if (!fs::exists(link)) return;
    const fs::file_status target = fs::status(p, ec);
    if (fs::is_regular_file(target)) return;
    const std::string what = !fs::exists(target)        ? "a symlink to nothing"
                             : fs::is_directory(target) ? "a directory"
                             : fs::is_character_file(target) || fs::is_block_file(target)
                                 ? "a device"
                                 : "not a regular file";
    throw IoError(fmt::format(
        "{}: {}{}, not a regular file: put the weights file itself there", p.string(), what,
        fs::is_symlink(link) ? fmt::format(" (a symlink to {})", fs::read_symlink(p, ec).string())
                             : ""));
}

}  // namespace

Checkpoint::Checkpoint(const std::string& dir) : dir_(dir) {
    const fs::path d(dir);
    refuse_if_not_regular(d / kWeightsFile);
    refuse_if_not_regular(d / kIndexFile);
    if (fs::is_regular_file(d / kWeightsFile)) {
        add_file(kWeightsFile);
        description_ = kWeightsFile;
        return;
    }
    const std::string index = (d / kIndexFile).string();
    if (!fs::is_regular_file(index)) {
        const bool pickle = fs::exists(d / "pytorch_model.bin");
        throw IoError(fmt::format(
            "{}: no {} and no {}{}", dir, kWeightsFile, kIndexFile,
            pickle ? "; its pytorch_model.bin is a pickle, which apiary does not load: save the "
                     "model as safetensors (save_pretrained(DIR, safe_serialization=True))"
                   : ""));
    }
    if (fs::file_size(index) > kMaxIndexBytes) {
        throw IoError(fmt::format("{}: {} bytes, more than the {} bytes an index may have", index,
                                  fs::file_size(index), kMaxIndexBytes));
    }
    json j;
    try {
        std::ifstream in(index);
        j = json::parse(in);
    } catch (const json::parse_error& e) {
        throw IoError(fmt::format("{}: not valid JSON (byte {})", index, e.byte));
    }
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
        throw DataError(fmt::format("{}: no 'weight_map' object", index));
    }
    std::set<std::string> files;
    for (const auto& [name, file] : j["weight_map"].items()) {
        const std::string f = file.is_string() ? file.get<std::string>() : "";
        if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..") {
            throw DataError(fmt::format("{}: tensor '{}' maps to {}, not a file name in {}", index,
                                        name, file.dump(), dir));
        }
        if (files.insert(f).second) add_file(f);
    }
    for (const auto& [name, file] : j["weight_map"].items()) {
        if (!has(name) || file_of(name) != (d / file.get<std::string>()).string()) {
            throw DataError(fmt::format("{}: maps tensor '{}' to {}, which does not hold it", index,
                                        name, file.get<std::string>()));
        }
    }
    description_ = fmt::format("{} files of {}", files.size(), kIndexFile);
}

void Checkpoint::add_file(const std::string& file) {
    const std::string path = (fs::path(dir_) / file).string();
    refuse_if_not_regular(path);
    files_.push_back(std::make_unique<ckpt::SafetensorsFile>(path, true));
    paths_.push_back(path);
    for (const auto& name : files_.back()->names()) {
        if (has(name)) {
            throw DataError(
                fmt::format("{}: tensor '{}' is also in {}", path, name, file_of(name)));
        }
        where_[name] = files_.size() - 1;
    }
}

std::vector<std::string> Checkpoint::names() const {
    std::vector<std::string> out;
    for (const auto& [name, i] : where_) out.push_back(name);
    return out;
}

const std::string& Checkpoint::file_of(const std::string& name) const {
    return paths_[where_.at(name)];
}

std::vector<float> Checkpoint::read(const std::string& name,
                                    const std::vector<int64_t>& shape) const {
    const ckpt::SafetensorsFile& f = *files_[where_.at(name)];
    const ckpt::TensorEntry& e = f.entry(name);
    const std::string& path = file_of(name);
    if (e.shape != shape) {
        throw DataError(
            fmt::format("{}: tensor '{}' has shape [{}], but config.json describes [{}]", path,
                        name, fmt::join(e.shape, ", "), fmt::join(shape, ", ")));
    }
    // The file's entry checked its shape against its bytes (no overflow).
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float> out(static_cast<size_t>(n));
    if (e.dtype == "F32") {
        f.read_bytes(name, 0, size_t(n) * sizeof(float), out.data());
    } else if (e.dtype == "BF16" || e.dtype == "F16") {
        std::vector<uint16_t> raw(static_cast<size_t>(n));
        f.read_bytes(name, 0, size_t(n) * sizeof(uint16_t), raw.data());
        const bool bf16 = e.dtype == "BF16";
        for (size_t i = 0; i < raw.size(); ++i) {
            out[i] = bf16 ? core::bf16_to_f32(raw[i]) : core::f16_to_f32(raw[i]);
        }
    } else {
        throw DataError(fmt::format("{}: tensor '{}' is {}; apiary imports F32, BF16 and F16", path,
                                    name, e.dtype));
    }
    for (size_t i = 0; i < out.size(); ++i) {
        if (!std::isfinite(out[i])) {
            throw DataError(
                fmt::format("{}: tensor '{}' holds {} at element {}", path, name, out[i], i));
        }
    }
    return out;
}

}  // namespace apiary::ckpt::hf
