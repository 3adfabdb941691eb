// `apiary ckpt export --format hf` and `apiary ckpt import`. For GPT-2
// (tied and untied head) and LLaMA with grouped-query attention (untied and
// tied): a model trained a few steps on bytes, exported, runs in PyTorch
// (tools/ref/hf_logits.py, which reads the directory as transformers would)
// to apiary's logits; imported back, its tensors are bit-identical, it
// generates the same text, and `train --resume` continues it from the
// start of its data with exactly the original model (learning rate 0: the
// same held-out loss). Then Hugging Face's other file forms (sharded with
// an index, BF16 and F16, GPT2Model names with mask buffers) and bad input:
// a missing tensor, a wrong shape, an extra tensor, an unsupported
// model_type or feature, a truncated file, conflicting settings.

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>

#include "../ckpt_util.h"
#include "../cli_util.h"
#include "ckpt/safetensors.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "model/model.h"
#include "train/checkpoint.h"

using namespace apiary;
using namespace apiary::testing;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// float32 apiary against a float64 reference, as in tests/model: relative
// to the largest logit.
constexpr double kTol = 1e-5;

// Debian's python3-torch is installed for the system interpreter.
std::string python() {
    if (const char* p = std::getenv("APIARY_PYTHON")) return p;
    return "/usr/bin/python3";
}

struct Case {
    const char* name;
    const char* model;  // --set model.* ...
    const char* arch;   // Hugging Face's
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

const Case kCases[] = {
    {"gpt2",
     "--set model.arch=gpt2 --set model.n_embd=48 --set model.n_head=3 --set model.ffn_hidden=160 "
     "--set model.tie_embeddings=true",
     "GPT2LMHeadModel"},
    {"gpt2_untied",
     "--set model.arch=gpt2 --set model.n_embd=48 --set model.n_head=3 "
     "--set model.tie_embeddings=false",
     "GPT2LMHeadModel"},
    {"llama_gqa",
     "--set model.arch=llama --set model.n_embd=64 --set model.n_head=4 --set model.n_kv_head=2 "
     "--set model.ffn_hidden=96 --set model.tie_embeddings=false --set model.rope_theta=5000 "
     "--set model.norm_eps=1e-6",
     "LlamaForCausalLM"},
    {"llama_tied",
     "--set model.arch=llama --set model.n_embd=64 --set model.n_head=4 --set model.n_kv_head=1 "
     "--set model.tie_embeddings=true",
     "LlamaForCausalLM"},
};

class HfBase : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        dir_ = fs::temp_directory_path() / ("apiary_hf_" + std::to_string(::getpid()));
        fs::remove_all(dir_);
        fs::create_directories(dir_);
        std::ofstream(dir_ / "corpus.txt") << [] {
            std::string s;
            for (int i = 0; i < 600; ++i) {
                s += "The LORD is my shepherd; I shall not want. He maketh me to lie down.\n";
            }
            return s;
        }();
    }
    static void TearDownTestSuite() { fs::remove_all(dir_); }

    // The data and shapes every run here shares (import passes them too).
    static std::string data_sets() {
        return " --set data.corpus=" + (dir_ / "corpus.txt").string() +
               " --set data.tokenizer=byte --set data.cache_dir=" + (dir_ / "cache").string() +
               " --set train.seq_len=32 --set train.batch_size=4 --set train.eval_batches=1 "
               "--set train.threads=1 --set train.log_every=1 ";
    }
    static fs::path path(const std::string& name) { return dir_ / name; }
    // A run of the case trained 12 steps, and its export (made once per process).
    static fs::path trained(const Case& c) {
        const fs::path run = path(std::string(c.name) + "_run");
        if (fs::exists(run)) return run;
        const auto t = run_command(apiary_bin() + " train --set run.dir=" + run.string() + " " +
                                   c.model + data_sets() +
                                   "--set model.n_layer=2 --set model.max_seq_len=64 "
                                   "--set train.steps=12 --set train.lr=1e-2 "
                                   "--set train.warmup_steps=2");
        EXPECT_EQ(t.exit_code, 0) << t.output;
        return run;
    }
    static fs::path exported(const Case& c) {
        const fs::path out = path(std::string(c.name) + "_hf");
        if (fs::exists(out)) return out;
        const auto e = run_command(apiary_bin() + " ckpt export " + trained(c).string() +
                                   " --format hf --out " + out.string());
        EXPECT_EQ(e.exit_code, 0) << e.output;
        return out;
    }
    static CommandResult import(const fs::path& hf, const fs::path& run,
                                const std::string& extra = "") {
        return run_command(apiary_bin() + " ckpt import " + hf.string() + " --out " + run.string() +
                           data_sets() + extra);
    }
    static fs::path dir_;
};
fs::path HfBase::dir_;

class HfTest : public HfBase, public ::testing::WithParamInterface<Case> {};

std::string case_name(const ::testing::TestParamInfo<Case>& info) { return info.param.name; }

json read_json(const fs::path& p) {
    std::ifstream in(p);
    return json::parse(in);
}

// Whether the reference interpreter has PyTorch (only the tests that run
// tools/ref/ need it; the others run without).
bool have_torch() {
    static const bool ok =
        std::system((python() + " -c 'import torch, numpy' 2>/dev/null").c_str()) == 0;
    return ok;
}

// The last record of metrics.jsonl with `key` at `step` (-1: any step).
json metric(const fs::path& run, const std::string& key, int64_t step = -1) {
    json found;
    for (const auto& line : read_lines((run / "metrics.jsonl").string())) {
        const json j = json::parse(line);
        if (j.contains(key) && (step < 0 || j.value("step", int64_t(-1)) == step)) found = j;
    }
    return found;
}

// The model of the run's latest checkpoint, read as `apiary generate` does.
std::vector<float> apiary_logits(const fs::path& run, const std::vector<int32_t>& tokens, int B,
                                 int T) {
    const train::CheckpointRef ck = train::latest_checkpoint(run.string());
    const core::ModelSpec spec = train::spec_from_json(ck.meta.at("model"), ck.dir);
    model::Transformer m(spec, B, T);
    train::load_weights(ck, m);
    std::vector<float> logits(size_t(B) * T * size_t(spec.vocab_size));
    m.forward_logits(logits.data(), tokens.data(), B, T);
    return logits;
}

}  // namespace

TEST_P(HfTest, ExportHasTransformersNamesAndConfig) {
    const Case& c = GetParam();
    const fs::path hf = exported(c);
    const json cfg = read_json(hf / "config.json");
    EXPECT_EQ(cfg["architectures"], json::array({c.arch}));
    EXPECT_EQ(cfg["torch_dtype"], "float32");
    EXPECT_EQ(cfg["vocab_size"], 257);
    EXPECT_EQ(cfg["eos_token_id"], 256);  // the byte tokenizer's <|endoftext|>
    const ckpt::SafetensorsFile f((hf / "model.safetensors").string(), true);
    EXPECT_EQ(f.metadata().at("format"), "pt");  // transformers refuses files without it
    const bool tied = cfg["tie_word_embeddings"].get<bool>();
    EXPECT_EQ(f.has("lm_head.weight"), !tied);
    if (std::string(c.arch) == "GPT2LMHeadModel") {
        EXPECT_EQ(cfg["n_positions"], 64);
        EXPECT_EQ(cfg["activation_function"], "gelu_new");
        EXPECT_EQ(f.entry("transformer.h.1.attn.c_attn.weight").shape,
                  (std::vector<int64_t>{48, 144}));  // Conv1D: (in, out)
        EXPECT_EQ(f.entry("transformer.h.0.mlp.c_proj.weight").shape,
                  (std::vector<int64_t>{cfg["n_inner"].get<int64_t>(), 48}));
        EXPECT_EQ(f.names().size(), size_t(2 + 12 * 2 + 2 + (tied ? 0 : 1)));
    } else {
        EXPECT_EQ(cfg["max_position_embeddings"], 64);
        EXPECT_EQ(cfg["hidden_act"], "silu");
        const int64_t kv = cfg["num_key_value_heads"].get<int64_t>() * 16;
        EXPECT_EQ(f.entry("model.layers.1.self_attn.k_proj.weight").shape,
                  (std::vector<int64_t>{kv, 64}));
        EXPECT_EQ(f.names().size(), size_t(1 + 9 * 2 + 1 + (tied ? 0 : 1)));
    }
    // The run's tokenizer goes with it.
    EXPECT_EQ(read_lines((hf / "tokenizer.json").string()),
              read_lines((trained(c) / "tokenizer.json").string()));
}

TEST_P(HfTest, PyTorchGetsApiarysLogits) {
    if (!have_torch()) {
        GTEST_SKIP() << python() << " cannot import torch and numpy (Debian: python3-torch)";
    }
    const Case& c = GetParam();
    const fs::path hf = exported(c);
    const int B = 2, T = 64;  // every learned position
    std::vector<int32_t> tokens(size_t(B) * T);
    const core::Philox rng(7, 1);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t(rng.below(i, 257));
    const fs::path in = path(std::string(c.name) + "_tokens.safetensors");
    const fs::path out = path(std::string(c.name) + "_logits.safetensors");
    ckpt::write_safetensors(in.string(),
                            {{"tokens", "I32", {B, T}, tokens.data(), tokens.size() * 4}}, {});
    const std::string cmd = python() + " " + APIARY_SOURCE_DIR + "/tools/ref/hf_logits.py " +
                            hf.string() + " " + in.string() + " " + out.string();
    const auto r = run_command(cmd);
    ASSERT_EQ(r.exit_code, 0) << cmd << "\n" << r.output;
    const std::vector<double> ref = ckpt::SafetensorsFile(out.string()).read_as_f64("logits");
    const std::vector<float> got = apiary_logits(trained(c), tokens, B, T);
    ASSERT_EQ(got.size(), ref.size());
    double err = 0, scale = 1e-30;
    for (size_t i = 0; i < ref.size(); ++i) {
        err = std::max(err, std::fabs(double(got[i]) - ref[i]));
        scale = std::max(scale, std::fabs(ref[i]));
    }
    EXPECT_LT(err / scale, kTol) << "max |apiary - PyTorch| " << err << " of " << scale;
    // Trained, not the initialisation: the logits are far from uniform.
    EXPECT_GT(scale, 1.0);
}

TEST_P(HfTest, ImportRoundTripsGeneratesAndResumes) {
    const Case& c = GetParam();
    const fs::path orig = trained(c), run = path(std::string(c.name) + "_imported");
    // Learning rate 0: the resumed step leaves the weights as imported.
    const auto imp = import(exported(c), run,
                            "--set train.steps=1 --set train.lr=0 --set train.min_lr=0 "
                            "--set train.warmup_steps=0");
    ASSERT_EQ(imp.exit_code, 0) << imp.output;
    const fs::path ck0 = run / "ckpt" / "step_00000000";
    EXPECT_EQ(checkpoint_tensors(ck0), checkpoint_tensors(train::latest_checkpoint(orig).dir));
    for (const auto& [name, v] : checkpoint_tensors(ck0, "adam_v")) {
        EXPECT_EQ(v, std::vector<double>(v.size(), 0.0)) << name;
    }
    EXPECT_EQ(checkpoint_manifest(ck0)["optimizer_steps"], 0);
    const auto verify = run_command(apiary_bin() + " ckpt verify " + run.string());
    EXPECT_EQ(verify.exit_code, 0) << verify.output;

    const std::string gen = " --prompt 'The LORD' --tokens 20 --seed 3 --temperature 0.9";
    const auto g0 = run_command(apiary_bin() + " generate --run " + orig.string() + gen);
    const auto g1 = run_command(apiary_bin() + " generate --run " + run.string() + gen);
    ASSERT_EQ(g0.exit_code, 0) << g0.output;
    EXPECT_EQ(g1.output, g0.output);

    const auto t = run_command(apiary_bin() + " train --resume " + run.string());
    ASSERT_EQ(t.exit_code, 0) << t.output;
    EXPECT_TRUE(fs::exists(run / "ckpt" / "step_00000001" / "manifest.json"));
    // The first step reads the first batch of the original run's stream,
    // and the model it evaluates is exactly the original's.
    EXPECT_EQ(metric(run, "batch_xxh64", 1)["batch_xxh64"],
              metric(orig, "batch_xxh64", 1)["batch_xxh64"]);
    EXPECT_DOUBLE_EQ(metric(run, "eval_loss", 1)["eval_loss"].get<double>(),
                     metric(orig, "eval_loss")["eval_loss"].get<double>());
}

INSTANTIATE_TEST_SUITE_P(Models, HfTest, ::testing::ValuesIn(kCases), case_name);

namespace {

// An export's tensors, by Hugging Face's names.
struct Tensor {
    std::vector<int64_t> shape;
    std::vector<float> v;
};
using Tensors = std::map<std::string, Tensor>;

Tensors load_tensors(const fs::path& file) {
    const ckpt::SafetensorsFile f(file.string());
    Tensors out;
    for (const auto& name : f.names()) {
        const auto& e = f.entry(name);
        const auto* p = static_cast<const float*>(e.data);
        out[name] = {e.shape, std::vector<float>(p, p + e.nbytes / 4)};
    }
    return out;
}

// Writes `t` as one safetensors file, each tensor as dtype(name): F32,
// BF16 or F16.
void save_tensors(const fs::path& file, const Tensors& t,
                  const std::function<std::string(const std::string&)>& dtype = {}) {
    std::vector<ckpt::TensorEntry> entries;
    std::vector<std::vector<uint16_t>> halves;
    halves.reserve(t.size());
    for (const auto& [name, x] : t) {
        const std::string d = dtype ? dtype(name) : "F32";
        if (d == "F32") {
            entries.push_back({name, d, x.shape, x.v.data(), x.v.size() * 4});
            continue;
        }
        halves.emplace_back();
        for (float f : x.v)
            halves.back().push_back(d == "BF16" ? core::f32_to_bf16(f) : core::f32_to_f16(f));
        entries.push_back({name, d, x.shape, halves.back().data(), halves.back().size() * 2});
    }
    ckpt::write_safetensors(file.string(), entries, {{"format", "pt"}});
}

}  // namespace

class HfImport : public HfBase {
  protected:
    // A copy of the case's export, to damage.
    static fs::path copy_export(const Case& c, const std::string& name) {
        const fs::path to = path(name);
        fs::remove_all(to);
        fs::copy(exported(c), to);
        return to;
    }
    // A copy whose model.safetensors `edit` changed.
    static fs::path with_weights(const Case& c, const std::string& name,
                                 const std::function<void(Tensors&)>& edit) {
        const fs::path hf = copy_export(c, name);
        Tensors t = load_tensors(hf / "model.safetensors");
        edit(t);
        save_tensors(hf / "model.safetensors", t);
        return hf;
    }
    static void edit_config(const fs::path& hf, const std::function<void(json&)>& edit) {
        json cfg = read_json(hf / "config.json");
        edit(cfg);
        std::ofstream(hf / "config.json") << cfg.dump(2);
    }
    // Runs an import that must fail, leaving no run directory; its message.
    static std::string import_error(const fs::path& hf, const std::string& extra = "") {
        const fs::path run = path(hf.filename().string() + "_run");
        const auto r = import(hf, run, extra);
        EXPECT_EQ(r.exit_code, 1) << r.output;
        EXPECT_FALSE(fs::exists(run)) << r.output;
        return r.output;
    }
    const Case& gpt2_ = kCases[0];
    const Case& llama_ = kCases[2];
};

TEST_F(HfImport, ShardedIndexWithBf16AndF16) {
    const fs::path hf = copy_export(llama_, "sharded");
    Tensors all = load_tensors(hf / "model.safetensors"), first, second;
    fs::remove(hf / "model.safetensors");
    json map;
    for (auto& [name, t] : all) {
        const bool one = name.find("layers.1.") == std::string::npos;
        (one ? first : second)[name] = t;
        map[name] = one ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
    }
    save_tensors(hf / "model-00001-of-00002.safetensors", first, [](auto&) { return "BF16"; });
    save_tensors(hf / "model-00002-of-00002.safetensors", second, [](auto&) { return "F16"; });
    std::ofstream(hf / "model.safetensors.index.json")
        << json{{"metadata", {{"total_size", 0}}}, {"weight_map", map}}.dump();
    const fs::path run = path("sharded_run");
    const auto r = import(hf, run);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("2 files of model.safetensors.index.json"), std::string::npos);
    // Each value is its BF16 / F16 rounding, widened exactly.
    const auto got = checkpoint_tensors(run / "ckpt" / "step_00000000");
    ASSERT_EQ(got.size(), all.size());
    for (const auto& [name, t] : all) {
        const bool bf16 = first.count(name) > 0;
        std::vector<double> want;
        for (float f : t.v) {
            want.push_back(bf16 ? core::bf16_to_f32(core::f32_to_bf16(f))
                                : core::f16_to_f32(core::f32_to_f16(f)));
        }
        EXPECT_EQ(got.at(name), want) << name;
    }
}

TEST_F(HfImport, Gpt2ModelNamesWithMaskBuffersAndDefaults) {
    // The original GPT-2 upload: GPT2Model's names (no `transformer.`),
    // each block's causal mask buffer, which is not a parameter, and a
    // config.json that leaves fields at transformers' defaults.
    const fs::path hf = with_weights(gpt2_, "gpt2model", [](Tensors& t) {
        Tensors renamed;
        for (auto& [name, x] : t) renamed[name.substr(std::string("transformer.").size())] = x;
        for (int l = 0; l < 2; ++l) {
            renamed[fmt::format("h.{}.attn.bias", l)] = {{1, 1, 64, 64},
                                                         std::vector<float>(4096, 1)};
        }
        t = renamed;
    });
    edit_config(hf, [](json& c) {
        for (const char* key : {"tie_word_embeddings", "layer_norm_epsilon", "scale_attn_weights",
                                "activation_function", "bos_token_id", "eos_token_id"}) {
            c.erase(key);
        }
    });
    const fs::path run = path("gpt2model_run");
    const auto r = import(hf, run);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(checkpoint_tensors(run / "ckpt" / "step_00000000"),
              checkpoint_tensors(train::latest_checkpoint(trained(gpt2_)).dir));
}

TEST_F(HfImport, MissingTensorIsNamed) {
    const fs::path hf = with_weights(gpt2_, "missing",
                                     [](Tensors& t) { t.erase("transformer.h.1.mlp.c_fc.bias"); });
    const std::string out = import_error(hf);
    EXPECT_NE(out.find("tensor 'transformer.h.1.mlp.c_fc.bias' (shape [160]) is missing from "
                       "model.safetensors"),
              std::string::npos)
        << out;
}

TEST_F(HfImport, WrongShapeIsNamed) {
    // apiary's own (out, in) layout where GPT-2's Conv1D is (in, out).
    const fs::path hf = with_weights(gpt2_, "shape", [](Tensors& t) {
        t["transformer.h.0.attn.c_attn.weight"].shape = {144, 48};
    });
    const std::string out = import_error(hf);
    EXPECT_NE(out.find((hf / "model.safetensors").string() +
                       ": tensor 'transformer.h.0.attn.c_attn.weight' has shape [144, 48], but "
                       "config.json describes [48, 144]"),
              std::string::npos)
        << out;
}

TEST_F(HfImport, TensorOfAnotherModelIsNamed) {
    const fs::path hf = with_weights(llama_, "extra", [](Tensors& t) {
        t["model.layers.2.input_layernorm.weight"] = {{64}, std::vector<float>(64, 1)};
    });
    const std::string out = import_error(hf);
    EXPECT_NE(out.find("tensor 'model.layers.2.input_layernorm.weight' is not part of a "
                       "LlamaForCausalLM with this config.json (2 layers"),
              std::string::npos)
        << out;
}

TEST_F(HfImport, UnsupportedModelsAreRefused) {
    const fs::path hf = copy_export(llama_, "unsupported");
    edit_config(hf, [](json& c) { c["model_type"] = "mistral"; });
    std::string out = import_error(hf);
    EXPECT_NE(out.find("config.json: model_type 'mistral' is not supported; apiary imports "
                       "'gpt2' (GPT2LMHeadModel) and 'llama' (LlamaForCausalLM)"),
              std::string::npos)
        << out;
    edit_config(hf, [](json& c) {
        c["model_type"] = "llama";
        c["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}};
    });
    out = import_error(hf);
    EXPECT_NE(out.find("config.json: rope_scaling = {"), std::string::npos) << out;
    const fs::path g = copy_export(gpt2_, "unsupported_gpt2");
    edit_config(g, [](json& c) { c["activation_function"] = "relu"; });
    out = import_error(g);
    EXPECT_NE(out.find("activation_function 'relu'"), std::string::npos) << out;
    edit_config(g, [](json& c) {
        c["activation_function"] = "gelu_new";
        c["n_head"] = "3";
    });
    out = import_error(g);
    EXPECT_NE(out.find("config.json: 'n_head' = \"3\" is not an integer"), std::string::npos)
        << out;
}

TEST_F(HfImport, TruncatedFilesAreRefused) {
    const fs::path hf = copy_export(gpt2_, "truncated");
    const fs::path f = hf / "model.safetensors";
    fs::resize_file(f, fs::file_size(f) - 100);
    std::string out = import_error(hf);
    EXPECT_NE(out.find(f.string() + ": tensor '"), std::string::npos) << out;
    EXPECT_NE(out.find("outside the"), std::string::npos) << out;
    fs::resize_file(f, 5);
    out = import_error(hf);
    EXPECT_NE(out.find(f.string() + ": 5 bytes is too short"), std::string::npos) << out;
    std::ofstream(hf / "config.json") << "{\"model_type\": \"gpt2\",";
    out = import_error(hf);
    EXPECT_NE(out.find("config.json: not valid JSON"), std::string::npos) << out;
}

TEST_F(HfImport, SettingsThatContradictTheModelAreRefused) {
    const fs::path hf = copy_export(gpt2_, "settings");
    std::string out = import_error(hf, "--set model.n_layer=3");
    EXPECT_NE(out.find("model.n_layer = 3 (from --set model.n_layer=3), but"), std::string::npos)
        << out;
    // A tokenizer other than the data's.
    const fs::path other = path("other_tokenizer.json");
    const auto t =
        run_command(apiary_bin() + " tokenizer train --input " + (dir_ / "corpus.txt").string() +
                    " --vocab-size 270 --out " + other.string());
    ASSERT_EQ(t.exit_code, 0) << t.output;
    out = import_error(hf, "--tokenizer " + other.string());
    EXPECT_NE(out.find("the model's tokenizer has hash"), std::string::npos) << out;
    // No tokenizer at all, and data that would train a new one.
    fs::remove(hf / "tokenizer.json");
    const auto r = run_command(apiary_bin() + " ckpt import " + hf.string() + " --out " +
                               path("settings_run").string());
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.output.find("has no tokenizer.json: give the model's tokenizer with --tokenizer"),
              std::string::npos)
        << r.output;
}

TEST_F(HfImport, ExistingRunIsKept) {
    const fs::path run = trained(gpt2_);
    const auto before = read_lines((run / "config.toml").string());
    const auto r = import(exported(gpt2_), run);
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.output.find("already exists and is not empty"), std::string::npos) << r.output;
    EXPECT_EQ(read_lines((run / "config.toml").string()), before);
    EXPECT_EQ(train::latest_checkpoint(run).step, 12);
}

TEST_F(HfImport, ExportRefusesAForeignDirectoryAndFormat) {
    const fs::path out = path("foreign");
    fs::create_directories(out);
    std::ofstream(out / "notes.txt") << "mine\n";
    const std::string cmd = apiary_bin() + " ckpt export " + trained(gpt2_).string();
    auto r = run_command(cmd + " --format hf --out " + out.string());
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.output.find("holds 'notes.txt', which an export does not write"), std::string::npos)
        << r.output;
    EXPECT_FALSE(fs::exists(out / "model.safetensors"));
    r = run_command(cmd + " --format onnx --out " + out.string());
    EXPECT_EQ(r.exit_code, 2) << r.output;
}

namespace {

// Hostile files in a Hugging Face folder, without torch: a weights file
// that is a symlink to a device, a config.json that is one, a safetensors
// header claiming 6e9 bytes.
class HfHostile : public ::testing::Test {
  protected:
    void SetUp() override {
        dir_ = fs::temp_directory_path() / ("apiary_hf_hostile_" + std::to_string(::getpid()));
        fs::remove_all(dir_);
        fs::create_directories(dir_ / "hf");
        std::ofstream(dir_ / "hf" / "config.json")
            << R"({"model_type": "gpt2", "vocab_size": 257, "n_positions": 32, "n_embd": 48,
                   "n_layer": 1, "n_head": 3})";
    }
    void TearDown() override { fs::remove_all(dir_); }
    // The output of an import that must fail, leaving no run directory.
    std::string import_error() const {
        const fs::path run = dir_ / "run";
        const auto r = run_command(apiary_bin() + " ckpt import " + (dir_ / "hf").string() +
                                   " --out " + run.string() + " --set data.tokenizer=byte 2>&1");
        EXPECT_EQ(r.exit_code, 1) << r.output;
        EXPECT_FALSE(fs::exists(run)) << r.output;
        return r.output;
    }
    fs::path dir_;
};

TEST_F(HfHostile, WeightsThatAreASymlinkToADeviceAreNotCalledMissing) {
    const fs::path w = dir_ / "hf" / "model.safetensors";
    fs::create_symlink("/dev/zero", w);
    const std::string out = import_error();
    EXPECT_NE(out.find(w.string() + ": a device (a symlink to /dev/zero), not a regular file"),
              std::string::npos)
        << out;
    EXPECT_EQ(out.find("no model.safetensors"), std::string::npos) << out;
}

TEST_F(HfHostile, AConfigThatIsADeviceIsRefusedUnread) {
    fs::remove(dir_ / "hf" / "config.json");
    fs::create_symlink("/dev/zero", dir_ / "hf" / "config.json");
    const std::string out = import_error();
    EXPECT_NE(out.find("config.json: not a regular file"), std::string::npos) << out;
}

TEST_F(HfHostile, AHugeHeaderLengthIsRefusedWithTheLimit) {
    const fs::path w = dir_ / "hf" / "model.safetensors";
    std::string bytes(100, ' ');
    const uint64_t hlen = 6000000000ull;
    std::memcpy(bytes.data(), &hlen, 8);
    std::ofstream(w, std::ios::binary) << bytes;
    const std::string out = import_error();
    EXPECT_NE(out.find(w.string() + ": the header length at byte 0 declares 6000000000 bytes"),
              std::string::npos)
        << out;
    EXPECT_NE(out.find("limit is 104857600 bytes"), std::string::npos) << out;
}

}  // namespace
