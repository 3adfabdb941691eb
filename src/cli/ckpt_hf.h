#pragma once
// `apiary ckpt export --format hf` and `apiary ckpt import`, hooked into the
// `ckpt` verb (ckpt_cmd.cc) from ckpt_hf_cmd.cc.

#include <CLI/CLI.hpp>
#include <string>

#include "train/checkpoint.h"

namespace apiary::cli {

// Writes out_dir/model.safetensors and out_dir/config.json as transformers'
// save_pretrained would for the checkpoint's model (GPT2LMHeadModel or
// LlamaForCausalLM), plus the run's tokenizer.json when it has one.
void export_hf(const train::CheckpointRef& ckpt, const std::string& out_dir);

// Adds `import` to the `ckpt` subcommand.
void add_ckpt_import(CLI::App& ckpt);

}  // namespace apiary::cli
