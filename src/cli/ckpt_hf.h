#pragma once
// `apiary ckpt export --format hf` and `apiary ckpt import`, hooked into the
// `ckpt` verb (ckpt_cmd.cc) from ckpt_hf_cmd.cc; train/hf.h converts.

#include <CLI/CLI.hpp>
#include <string>

#include "train/checkpoint.h"

namespace apiary::cli {

// train::export_hf, then prints what it wrote.
void export_hf(const train::CheckpointRef& ckpt, const std::string& out_dir);

// Adds `import` to the `ckpt` subcommand.
void add_ckpt_import(CLI::App& ckpt);

}  // namespace apiary::cli
