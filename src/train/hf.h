#pragma once
// A checkpoint as a Hugging Face model directory, and such a directory as a
// new run at step 0 (ckpt/hf_format.h is the format; `apiary ckpt export
// --format hf` and `apiary ckpt import` call these, cli/ckpt_hf_cmd.cc).

#include <cstdint>
#include <string>

#include "core/config.h"
#include "core/model_spec.h"
#include "train/checkpoint.h"

namespace apiary::train {

// What an export wrote.
struct HfExport {
    core::ModelSpec spec;
    size_t tensors = 0;
    int64_t params = 0;
    bool tokenizer = false;  // tokenizer.json written too
};

// Writes out_dir/model.safetensors and out_dir/config.json as transformers'
// save_pretrained would for the checkpoint's model (GPT2LMHeadModel or
// LlamaForCausalLM), plus the run's tokenizer.json when it has one.
HfExport export_hf(const CheckpointRef& ckpt, const std::string& out_dir);

// A Hugging Face model directory to import: its config.json read and
// checked, and the model's tokenizer.
struct HfModel {
    std::string dir;
    std::string config_path;  // dir/config.json, for messages
    core::ModelSpec spec;
    std::string tokenizer;  // absolute path, "" for none
};

// `tokenizer`: the model's tokenizer.json given by the user, else the one
// in hf_dir when there is one.
HfModel open_hf_model(const std::string& hf_dir, const std::string& tokenizer);

struct HfImport {
    std::string source;  // the files read: "model.safetensors" or "N files of ..."
    std::string checkpoint_dir;
};

// Makes the model a new run at step 0 in `out`: `config` is the run's
// (--config and --set), whose model.* must agree with config.json;
// `overwrite` replaces an existing run directory.
HfImport import_hf(const HfModel& model, core::Config config, const std::string& out,
                   bool overwrite);

}  // namespace apiary::train
