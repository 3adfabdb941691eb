#pragma once
// Hugging Face's layout of a GPT-2 or LLaMA model (docs/formats.md,
// "Hugging Face export and import"): the directory transformers'
// save_pretrained writes, config.json plus model.safetensors (or shards
// listed by model.safetensors.index.json), for GPT2LMHeadModel and
// LlamaForCausalLM.
//
// apiary's tensor names are already Hugging Face's; GPT2LMHeadModel puts
// `transformer.` before all but `lm_head.weight`, and stores the four
// matrices of a block as Conv1D, (in, out), where apiary stores (out, in)
// as torch.nn.Linear does. A tied LM head is not stored (the embedding is).

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/safetensors.h"
#include "core/model_spec.h"

namespace apiary::ckpt::hf {

constexpr const char* kConfigFile = "config.json";
constexpr const char* kWeightsFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

// "GPT2LMHeadModel" or "LlamaForCausalLM".
const char* architecture(core::Arch arch);

// A GPT-2 matrix that Hugging Face stores as Conv1D, transposed (in, out).
bool is_conv1d(core::Arch arch, const std::string& name);
// Hugging Face's name of the apiary tensor `name` (prefix: "transformer."
// for GPT2LMHeadModel, "" for GPT-2 files saved from GPT2Model).
std::string hf_name(core::Arch arch, const std::string& name,
                    const std::string& gpt2_prefix = "transformer.");
// Its shape in Hugging Face's file, from apiary's.
std::vector<int64_t> hf_shape(core::Arch arch, const std::string& name, std::vector<int64_t> shape);
// Buffers some files carry that are not parameters (GPT-2's causal mask
// `attn.bias` / `attn.masked_bias`, LLaMA's `rotary_emb.inv_freq`): ignored.
bool is_buffer(core::Arch arch, const std::string& hf_name);
// A float by its shortest decimal form, so that config files say 1e-05
// rather than the float's exact value 9.99999974737875e-06 (both read back
// as the same float).
double shortest(float f);
// (rows, cols) -> (cols, rows).
std::vector<float> transposed(const std::vector<float>& a, int64_t rows, int64_t cols);

// config.json for the model; eos: the id of <|endoftext|> when the
// tokenizer has one (bos_token_id and eos_token_id, else null).
nlohmann::json config_json(const core::ModelSpec& spec, std::optional<uint32_t> eos);
// The model a config.json describes, with transformers' defaults for
// absent fields. Throws DataError naming `where` and the field for an
// unsupported model_type or feature (RoPE scaling, biases in LLaMA, another
// activation) or a value of the wrong type or range.
core::ModelSpec spec_from_config(const nlohmann::json& config, const std::string& where);
// The JSON of `path` (a model's config.json): a device, a directory or a
// file over 16 MiB is refused unread, a missing file or invalid JSON is an
// IoError naming the path.
nlohmann::json read_config_json(const std::string& path);

// The tensors of a Hugging Face model directory by name, read on demand:
// model.safetensors, or else the files model.safetensors.index.json maps
// names to. Every header is checked on open (truncated or malformed files
// are an IoError naming the file).
class Checkpoint {
  public:
    explicit Checkpoint(const std::string& dir);
    bool has(const std::string& name) const { return where_.count(name) > 0; }
    std::vector<std::string> names() const;
    // The file that holds `name`, for messages.
    const std::string& file_of(const std::string& name) const;
    // The tensor as floats (F32, or BF16 / F16 widened exactly), after
    // checking that its shape is `shape`; DataError naming the file, the
    // tensor and both shapes otherwise.
    std::vector<float> read(const std::string& name, const std::vector<int64_t>& shape) const;
    // What was read: "model.safetensors" or "N files of model.safetensors.index.json".
    const std::string& description() const { return description_; }

  private:
    void add_file(const std::string& file);
    std::string dir_, description_;
    std::vector<std::unique_ptr<SafetensorsFile>> files_;
    std::vector<std::string> paths_;
    std::map<std::string, size_t> where_;  // tensor -> index into files_
};

}  // namespace apiary::ckpt::hf
