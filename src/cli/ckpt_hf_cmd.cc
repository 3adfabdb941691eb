// `apiary ckpt export RUN --format hf --out DIR` and `apiary ckpt import
// HF_DIR --out RUN`: the options and what they print; the conversion is
// train/hf.h's, the format ckpt/hf_format.h's.

#include <fmt/format.h>

#include <string>
#include <vector>

#include "ckpt/hf_format.h"
#include "cli/ckpt_hf.h"
#include "cli/command.h"
#include "train/hf.h"
#include "train/train_data.h"

namespace apiary::cli {

namespace hf = ckpt::hf;

void export_hf(const train::CheckpointRef& ck, const std::string& out) {
    const train::HfExport e = train::export_hf(ck, out);
    fmt::print("{}: {} of step {} from {}: {} tensors, {:.3f}M parameters; {}{}\n", out,
               hf::architecture(e.spec.arch), ck.step, ck.dir, e.tensors, double(e.params) / 1e6,
               hf::kConfigFile, e.tokenizer ? std::string(", ") + train::kTokenizerFile : "");
}

namespace {

struct ImportArgs {
    std::string hf_dir, out, tokenizer, config_file;
    std::vector<std::string> sets;
    bool overwrite = false;
};

void import_hf(const ImportArgs& a) {
    const train::HfModel model = train::open_hf_model(a.hf_dir, a.tokenizer);
    const train::HfImport r =
        train::import_hf(model, load_config(a.config_file, a.sets), a.out, a.overwrite);
    fmt::print(
        "{}: {} from {} ({}, {:.3f}M parameters) as step 0 in {}; sample with `apiary generate "
        "--run {}`, train with `apiary train --resume {}`\n",
        a.out, hf::architecture(model.spec.arch), a.hf_dir, r.source,
        double(model.spec.num_params()) / 1e6, r.checkpoint_dir, a.out, a.out);
}

}  // namespace

void add_ckpt_import(CLI::App& ckpt) {
    static ImportArgs a;
    auto* cmd = ckpt.add_subcommand(
        "import", "a Hugging Face GPT-2 or LLaMA model directory as a new run at step 0");
    cmd->add_option("hf_dir", a.hf_dir,
                    "config.json with model.safetensors (or model.safetensors.index.json and "
                    "its files)")
        ->required();
    cmd->add_option("--out", a.out, "the run directory to create")->required();
    cmd->add_option("--tokenizer", a.tokenizer,
                    "the model's tokenizer.json (default: the one in hf_dir, if any)");
    cmd->add_option("--config", a.config_file,
                    "TOML config of the run (data.*, train.*; model.* come from config.json)")
        ->check(CLI::ExistingFile);
    cmd->add_option("--set", a.sets, "override a config key (repeatable)");
    cmd->add_flag("--overwrite", a.overwrite, "replace an existing run directory");
    cmd->callback([] { import_hf(a); });
}

}  // namespace apiary::cli
