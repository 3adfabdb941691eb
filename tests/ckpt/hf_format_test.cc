// Hugging Face's format (ckpt/hf_format.h) without the binary: config.json
// round trips apiary's model, tensor names and shapes map both ways, and a
// hostile or unsupported config.json is refused with a message naming the key.

#include "ckpt/hf_format.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"

namespace apiary::ckpt::hf {
namespace {

namespace fs = std::filesystem;
using core::Arch;
using nlohmann::json;

void expect_same_model(const core::ModelSpec& a, const core::ModelSpec& b) {
    EXPECT_EQ(a.arch, b.arch);
    EXPECT_EQ(a.n_layer, b.n_layer);
    EXPECT_EQ(a.n_embd, b.n_embd);
    EXPECT_EQ(a.n_head, b.n_head);
    EXPECT_EQ(a.n_kv_head, b.n_kv_head);
    EXPECT_EQ(a.vocab_size, b.vocab_size);
    EXPECT_EQ(a.max_seq_len, b.max_seq_len);
    EXPECT_EQ(a.ffn_dim(), b.ffn_dim());
    EXPECT_EQ(a.tie_embeddings, b.tie_embeddings);
    EXPECT_EQ(a.norm_eps, b.norm_eps);
    if (a.arch == Arch::llama) {
        EXPECT_EQ(a.rope_theta, b.rope_theta);
    }
}

TEST(HfFormat, Gpt2SpecRoundTripsThroughConfigJson) {
    const core::ModelSpec s = core::preset("gpt2-124m");
    const json c = config_json(s, 50256);
    EXPECT_EQ(c["architectures"], json::array({"GPT2LMHeadModel"}));
    EXPECT_EQ(c["model_type"], "gpt2");
    EXPECT_EQ(c["n_embd"], 768);
    EXPECT_EQ(c["n_inner"], 3072);
    EXPECT_EQ(c["eos_token_id"], 50256);
    EXPECT_EQ(c["layer_norm_epsilon"], 1e-5);  // the shortest decimal, not the float's value
    // Through text, as a file would carry it.
    expect_same_model(spec_from_config(json::parse(c.dump()), "config.json"), s);
}

TEST(HfFormat, LlamaSpecRoundTripsThroughConfigJson) {
    core::ModelSpec s = core::preset("llama-60m");
    s.n_kv_head = 2;  // grouped-query attention
    s.rope_theta = 500000.0f;
    s.norm_eps = 1e-6f;
    const json c = config_json(s, std::nullopt);
    EXPECT_EQ(c["architectures"], json::array({"LlamaForCausalLM"}));
    EXPECT_EQ(c["num_key_value_heads"], 2);
    EXPECT_EQ(c["hidden_size"], s.n_embd);
    EXPECT_EQ(c["intermediate_size"], s.ffn_dim());
    EXPECT_TRUE(c["eos_token_id"].is_null());
    expect_same_model(spec_from_config(json::parse(c.dump()), "config.json"), s);
}

TEST(HfFormat, AbsentFieldsTakeTransformersDefaults) {
    const core::ModelSpec s = spec_from_config({{"model_type", "gpt2"}}, "config.json");
    EXPECT_EQ(s.n_layer, 12);
    EXPECT_EQ(s.n_embd, 768);
    EXPECT_EQ(s.vocab_size, 50257);
    EXPECT_EQ(s.ffn_dim(), 4 * 768);
    EXPECT_TRUE(s.tie_embeddings);
}

TEST(HfFormat, NamesAndShapesMapBothWays) {
    // GPT2LMHeadModel: "transformer." before all but the head; the block's
    // four matrices transposed (Conv1D).
    EXPECT_EQ(hf_name(Arch::gpt2, "h.0.attn.c_attn.weight"), "transformer.h.0.attn.c_attn.weight");
    EXPECT_EQ(hf_name(Arch::gpt2, "wte.weight", ""), "wte.weight");
    EXPECT_EQ(hf_name(Arch::gpt2, "lm_head.weight"), "lm_head.weight");
    EXPECT_EQ(hf_name(Arch::llama, "model.layers.0.self_attn.q_proj.weight"),
              "model.layers.0.self_attn.q_proj.weight");
    EXPECT_TRUE(is_conv1d(Arch::gpt2, "h.3.mlp.c_fc.weight"));
    EXPECT_FALSE(is_conv1d(Arch::gpt2, "h.3.mlp.c_fc.bias"));
    EXPECT_FALSE(is_conv1d(Arch::llama, "model.layers.0.mlp.up_proj.weight"));
    EXPECT_EQ(hf_shape(Arch::gpt2, "h.0.attn.c_attn.weight", {2304, 768}),
              (std::vector<int64_t>{768, 2304}));
    EXPECT_EQ(hf_shape(Arch::gpt2, "wpe.weight", {1024, 768}), (std::vector<int64_t>{1024, 768}));
    EXPECT_TRUE(is_buffer(Arch::gpt2, "transformer.h.0.attn.bias"));
    EXPECT_TRUE(is_buffer(Arch::llama, "model.layers.0.self_attn.rotary_emb.inv_freq"));
    EXPECT_FALSE(is_buffer(Arch::llama, "model.layers.0.self_attn.q_proj.weight"));

    // A Conv1D matrix there and back, over tile edges (rows, cols not multiples of 16).
    const int64_t rows = 37, cols = 21;
    std::vector<float> a(size_t(rows * cols));
    for (size_t i = 0; i < a.size(); ++i) a[i] = float(i);
    const std::vector<float> t = transposed(a, rows, cols);
    EXPECT_EQ(t[size_t(5 * rows + 3)], a[size_t(3 * cols + 5)]);
    EXPECT_EQ(transposed(t, cols, rows), a);
}

// The message of the DataError spec_from_config throws for `config`.
std::string refusal(const json& config) {
    try {
        spec_from_config(config, "m/config.json");
    } catch (const DataError& e) {
        return e.what();
    }
    ADD_FAILURE() << config.dump() << " was accepted";
    return "";
}

TEST(HfFormat, HostileConfigIsRefusedNamingTheKey) {
    const json gpt2 = {{"model_type", "gpt2"}};
    auto with = [](json c, const char* key, json v) {
        c[key] = std::move(v);
        return c;
    };
    std::string m = refusal(with(gpt2, "n_layer", -3));
    EXPECT_NE(m.find("m/config.json"), std::string::npos) << m;
    EXPECT_NE(m.find("'n_layer' = -3"), std::string::npos) << m;
    m = refusal(with(gpt2, "n_embd", "768"));
    EXPECT_NE(m.find("'n_embd'"), std::string::npos) << m;
    m = refusal(with(gpt2, "vocab_size", 18446744073709551615ull));
    EXPECT_NE(m.find("'vocab_size'"), std::string::npos) << m;
    m = refusal(with(gpt2, "layer_norm_epsilon", -1.0));
    EXPECT_NE(m.find("'layer_norm_epsilon'"), std::string::npos) << m;
    m = refusal(with(gpt2, "tie_word_embeddings", 1));
    EXPECT_NE(m.find("'tie_word_embeddings'"), std::string::npos) << m;
    m = refusal(with(gpt2, "activation_function", "relu"));
    EXPECT_NE(m.find("activation_function 'relu'"), std::string::npos) << m;

    const json llama = {{"model_type", "llama"}, {"hidden_size", 64}, {"num_attention_heads", 4}};
    m = refusal(with(llama, "rope_scaling", {{"rope_type", "linear"}, {"factor", 2.0}}));
    EXPECT_NE(m.find("rope_scaling"), std::string::npos) << m;
    m = refusal(with(llama, "attention_bias", true));
    EXPECT_NE(m.find("attention_bias = true"), std::string::npos) << m;
    m = refusal(with(llama, "head_dim", 32));
    EXPECT_NE(m.find("head_dim = 32"), std::string::npos) << m;

    m = refusal({{"model_type", "bert"}});
    EXPECT_NE(m.find("model_type 'bert'"), std::string::npos) << m;
    m = refusal(json::array());
    EXPECT_NE(m.find("not a JSON object"), std::string::npos) << m;
}

// A fresh directory, removed when the test ends.
struct ScratchDir {
    fs::path path = fs::temp_directory_path() / ("apiary_hf_" + std::to_string(::getpid()));
    ScratchDir() { fs::create_directories(path); }
    ~ScratchDir() { fs::remove_all(path); }
};

TEST(HfFiles, ConfigJsonThatIsNoFileOrNoJsonIsRefused) {
    const ScratchDir d;
    const fs::path missing = d.path / kConfigFile;
    EXPECT_THROW(read_config_json(missing.string()), IoError);
    fs::create_directory(missing);  // a directory where the file should be
    try {
        read_config_json(missing.string());
        ADD_FAILURE() << "a directory was read";
    } catch (const IoError& e) {
        EXPECT_NE(std::string(e.what()).find("not a regular file"), std::string::npos) << e.what();
    }
    fs::remove(missing);
    std::ofstream(missing) << "{\"model_type\": ";
    EXPECT_THROW(read_config_json(missing.string()), IoError);
    std::ofstream(missing) << R"({"model_type": "gpt2"})";
    EXPECT_EQ(read_config_json(missing.string())["model_type"], "gpt2");
}

TEST(HfFiles, WeightsFolderWithNeitherFileIsNamed) {
    const ScratchDir d;
    std::ofstream(d.path / "pytorch_model.bin") << "pickle";
    try {
        Checkpoint ck(d.path.string());
        ADD_FAILURE() << "a folder without safetensors was opened";
    } catch (const IoError& e) {
        EXPECT_NE(std::string(e.what()).find("pickle"), std::string::npos) << e.what();
    }
}

}  // namespace
}  // namespace apiary::ckpt::hf
