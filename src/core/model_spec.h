#pragma once
// The shape of a transformer language model, shared by the trainer (model/)
// and the planner (plan/), with named presets. One struct so that one config
// file describes a run for both.

#include <cstdint>
#include <string>
#include <vector>

namespace apiary::core {

enum class Arch { gpt2, llama };

const char* arch_name(Arch arch);
Arch parse_arch(const std::string& name);  // throws ConfigError

struct ModelSpec {
    Arch arch = Arch::gpt2;
    int n_layer = 4;       // L
    int n_embd = 192;      // C
    int n_head = 6;        // NH
    int n_kv_head = 6;     // grouped-query attention: NH must be a multiple of it
    int vocab_size = 256;  // V
    int max_seq_len = 256; // learned positions (gpt2) or RoPE table size (llama)
    int ffn_hidden = 0;    // 0: 4C for gpt2, SwiGLU's 256-rounded 8C/3 for llama
    bool tie_embeddings = true;
    float norm_eps = 1e-5f;
    float rope_theta = 10000.0f;

    int head_size() const { return n_embd / n_head; }  // HS
    int kv_dim() const { return n_kv_head * head_size(); }
    int ffn_dim() const;  // resolved ffn_hidden

    // Exact parameter count of apiary's implementation of this model.
    int64_t num_params() const;
    // Parameters that are weights of matrix multiplies (excludes embeddings,
    // positions, norms, biases), plus the LM head.
    int64_t num_matmul_params() const;
    // Training FLOPs per token at sequence length T: 6 x matmul parameters
    // (forward 2, backward 4) plus attention 12 x L x T x C (scores and the
    // weighted sum, causal mask not discounted, as in PaLM / Megatron).
    double train_flops_per_token(int seq_len) const;

    // Throws ConfigError naming the first inconsistent field.
    void validate() const;
};

// Named presets: "tiny" (the default main job), "gpt2-124m", "gpt2-350m",
// "llama-60m", the large published models, and small test shapes.
const ModelSpec* find_preset(const std::string& name);
// Throws ConfigError listing the known names.
const ModelSpec& preset(const std::string& name);
std::vector<std::string> preset_names();

}  // namespace apiary::core
