// `apiary ckpt inspect|verify|export`: what a checkpoint holds, whether it
// is intact (every file's and chunk's checksum, every slice of every tensor
// stored exactly once), and its tensors gathered into one safetensors file
// by global name (or, with --format hf, a Hugging Face model directory:
// ckpt_hf_cmd.cc, which also adds `ckpt import`). Each takes a run
// directory (its latest checkpoint) or a checkpoint directory (ckpt/step_N).

#include <fmt/format.h>

#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>

#include "ckpt/safetensors.h"
#include "ckpt/sharded.h"
#include "cli/ckpt_hf.h"
#include "cli/command.h"
#include "core/error.h"
#include "train/checkpoint.h"

namespace apiary::cli {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

bool is_run_dir(const std::string& path) { return fs::is_directory(fs::path(path) / "ckpt"); }

// A run directory means its latest checkpoint (refused, naming the newest
// intact one, if `latest` or its checkpoint is damaged).
train::CheckpointRef resolve(const std::string& path, bool full_check) {
    if (is_run_dir(path)) {
        const auto ref = train::latest_checkpoint(path);
        return full_check ? train::open_checkpoint(ref.dir) : ref;
    }
    if (!fs::is_directory(path)) throw IoError(fmt::format("{}: no such directory", path));
    return train::open_checkpoint(path);
}

void inspect(const std::string& path) {
    const train::CheckpointRef ck = resolve(path, false);
    const ckpt::CheckpointReader reader(ck.dir);
    const json& m = ck.meta;
    fmt::print("checkpoint {} (format version {})\n", ck.dir, ck.version);
    fmt::print("  step {}, {} optimizer steps, {} tokens seen\n", ck.step,
               m.value("optimizer_steps", json("?")).dump(), m.value("tokens", json("?")).dump());
    fmt::print("  model {}\n", m["model"].dump());
    if (m.contains("layout")) fmt::print("  saved under layout {}\n", m["layout"].dump());
    fmt::print("  precision {}, tokenizer {} ({})\n", m.value("precision", "?"),
               m.value("tokenizer", "?"), m.value("tokenizer_hash", "?"));
    int64_t params = 0;
    for (const auto& name : reader.tensors("param")) {
        int64_t n = 1;
        for (int64_t d : reader.global_shape("param", name)) n *= d;
        params += n;
    }
    fmt::print("  {} tensors, {:.3f}M parameters, {} chunks\n", reader.tensors("param").size(),
               double(params) / 1e6, reader.num_chunks());
    for (const auto& [name, rec] : reader.files().items()) {
        fmt::print("  {:<28} {:>12} bytes  xxh64 {}\n", name, rec.value("bytes", json()).dump(),
                   rec.value("xxh64", ""));
    }
}

void print_ok(const train::CheckpointRef& ck) {
    const ckpt::CheckpointReader reader(ck.dir);
    fmt::print(
        "{}: OK ({} files, {} chunks, every checksum matches, every tensor stored exactly "
        "once, the step, optimizer, loader and loss-scaler counters agree)\n",
        ck.dir, reader.files().size(), reader.num_chunks());
}

// A run directory: the checkpoint `latest` names; if `latest` or that
// checkpoint is damaged, what is wrong and which one is intact (exit 1).
void verify_run(const std::string& path) {
    const train::LatestName latest = train::read_latest(path);
    std::string damaged = latest.problem;
    if (damaged.empty()) {
        try {
            print_ok(train::verify_checkpoint(latest.dir));
            return;
        } catch (const IoError& e) {
            damaged = e.what();
        }
    }
    const int64_t below = latest.step >= 0 ? latest.step : std::numeric_limits<int64_t>::max();
    std::vector<std::string> why;
    const auto good = train::newest_intact(path, below, &why);
    for (const auto& w : why) fmt::print("{}\n", w);
    if (!good) {
        throw IoError(fmt::format("{}\nno {}intact checkpoint in {}/ckpt", damaged,
                                  latest.step >= 0 ? "earlier " : "", path));
    }
    print_ok(*good);
    throw IoError(damaged + "\n" + train::continue_from(path, latest, *good));
}

void verify(const std::string& path) {
    if (is_run_dir(path)) return verify_run(path);
    if (!fs::is_directory(path)) throw IoError(fmt::format("{}: no such directory", path));
    print_ok(train::verify_checkpoint(path));
}

void export_tensors(const std::string& path, const std::string& out) {
    if (out.empty()) throw ConfigError("ckpt export: give --out FILE");
    const train::CheckpointRef ck = resolve(path, false);
    const ckpt::CheckpointReader reader(ck.dir);
    std::vector<std::vector<float>> data;
    std::vector<ckpt::TensorEntry> entries;
    for (const auto& name : reader.tensors("param")) {
        core::Placement whole;
        whole.global_shape = whole.local_shape = reader.global_shape("param", name);
        data.emplace_back(size_t(whole.local_numel()));
        reader.read("param", name, whole, 0, whole.local_numel(), data.back().data());
    }
    size_t i = 0;
    for (const auto& name : reader.tensors("param")) {
        entries.push_back({name, "F32", reader.global_shape("param", name), data[i].data(),
                           data[i].size() * sizeof(float)});
        ++i;
    }
    ckpt::write_safetensors(
        out, entries,
        {{"format", "pt"}, {"producer", "apiary"}, {"step", std::to_string(ck.step)}});
    fmt::print("{}: {} tensors of step {} from {}\n", out, entries.size(), ck.step, ck.dir);
}

void setup(CLI::App& app) {
    auto* cmd = app.add_subcommand("ckpt", "inspect, verify, export and import checkpoints");
    cmd->require_subcommand(1);
    static std::string path, out, format = "apiary";
    auto* ins = cmd->add_subcommand("inspect", "what a checkpoint holds");
    ins->add_option("path", path, "run directory (its latest checkpoint) or checkpoint directory")
        ->required();
    ins->callback([] { inspect(path); });
    auto* ver = cmd->add_subcommand("verify", "every checksum, every slice covered exactly once");
    ver->add_option("path", path, "run directory or checkpoint directory")->required();
    ver->callback([] { verify(path); });
    auto* exp = cmd->add_subcommand(
        "export", "every parameter, gathered by global name, into one safetensors file");
    exp->add_option("path", path, "run directory or checkpoint directory")->required();
    exp->add_option("--out", out, "the safetensors file to write (--format hf: the directory)")
        ->required();
    exp->add_option("--format", format,
                    "apiary (tensors by apiary's names and shapes) or hf (a Hugging Face "
                    "GPT2LMHeadModel / LlamaForCausalLM directory)")
        ->check(CLI::IsMember({"apiary", "hf"}))
        ->capture_default_str();
    exp->callback([] {
        if (format == "hf") {
            export_hf(resolve(path, false), out);
        } else {
            export_tensors(path, out);
        }
    });
    add_ckpt_import(*cmd);
}

CommandRegistrar reg("ckpt", setup);

}  // namespace

}  // namespace apiary::cli
