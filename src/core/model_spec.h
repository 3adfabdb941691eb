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
    int n_layer = 4;        // L
    int n_embd = 192;       // C
    int n_head = 6;         // NH
    int n_kv_head = 6;      // grouped-query attention: NH must be a multiple of it
    int vocab_size = 256;   // V
    int max_seq_len = 256;  // learned positions (gpt2) or RoPE table size (llama)
    int ffn_hidden = 0;     // 0: 4C for gpt2, SwiGLU's 256-rounded 8C/3 for llama
    bool tie_embeddings = true;
    float norm_eps = 1e-5f;
    float rope_theta = 10000.0f;
    int head_dim = 0;  // query/key/value width per head (0: n_embd / n_head)
    // Multi-head latent attention (DeepSeek-V2/V3), on when kv_lora_rank > 0:
    // queries and keys/values go through low-rank projections; head_dim is
    // then the non-rotary query/key width, plus qk_rope_dim rotary dims.
    int q_lora_rank = 0, kv_lora_rank = 0, qk_rope_dim = 0, v_head_dim = 0;
    // Mixture of experts, on when n_expert > 0: every block after the first
    // moe_dense_layers has n_expert routed MLPs of width moe_ffn_hidden, of
    // which each token uses n_expert_active, plus n_shared_expert always used.
    // The shared experts act as one MLP of width n_shared_expert x
    // moe_ffn_hidden (the same function as their sum).
    int n_expert = 0, n_expert_active = 0, n_shared_expert = 0;
    int moe_ffn_hidden = 0, moe_dense_layers = 0;
    // How the trainer routes (keys model.moe_*): a sigmoid router whose
    // per-expert bias steers the choice only (DeepSeek-V3) instead of a
    // softmax one; no capacity cut (dropless), or capacity_factor times an
    // expert's even share N K / E of a micro-batch's choices; the
    // coefficients of the load-balancing loss and of the router z-loss.
    bool moe_sigmoid = false;
    bool moe_dropless = false;
    float moe_capacity_factor = 1.25f;
    float moe_aux_loss_coef = 0.01f;
    float moe_z_loss_coef = 0.001f;

    int head_size() const { return head_dim > 0 ? head_dim : n_embd / n_head; }  // HS
    int kv_dim() const { return n_kv_head * head_size(); }
    int ffn_dim() const;  // resolved ffn_hidden
    bool mla() const { return kv_lora_rank > 0; }
    bool moe() const { return n_expert > 0; }
    int moe_layers() const { return moe() ? n_layer - moe_dense_layers : 0; }
    bool moe_layer(int l) const { return moe() && l >= moe_dense_layers; }
    int expert_ffn_dim() const { return moe_ffn_hidden > 0 ? moe_ffn_hidden : ffn_dim(); }
    // Weights of one attention block / one MLP (a dense one, or one expert).
    int64_t attn_params() const;
    int64_t mlp_params(int64_t width) const;
    // Query-key and value widths summed over heads (n_embd each for plain
    // multi-head attention): attention-core FLOPs scale with their sum.
    int64_t qk_width() const;
    int64_t v_width() const;

    // Exact parameter count of apiary's implementation of this model.
    int64_t num_params() const;
    // Parameters that are weights of matrix multiplies (excludes embeddings,
    // positions, norms, biases), plus the LM head.
    int64_t num_matmul_params() const;
    // The matmul parameters one token uses: all but the unrouted experts.
    int64_t num_active_matmul_params() const;
    // Training FLOPs per token at sequence length T: 6 x active matmul
    // parameters (forward 2, backward 4) plus attention 6 x L x T x (qk + v
    // widths), 12 L T C for plain attention (scores and the weighted sum,
    // causal mask not discounted, as in PaLM / Megatron).
    double train_flops_per_token(int seq_len) const;

    // A field the trainer cannot run yet (latent attention, a
    // head width other than n_embd / n_head), described; "" when none.
    std::string trainer_unsupported() const;

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
