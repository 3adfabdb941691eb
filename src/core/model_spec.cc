#include "core/model_spec.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>

#include "core/error.h"

namespace apiary::core {

const char* arch_name(Arch arch) { return arch == Arch::gpt2 ? "gpt2" : "llama"; }

Arch parse_arch(const std::string& name) {
    if (name == "gpt2") return Arch::gpt2;
    if (name == "llama") return Arch::llama;
    throw ConfigError(
        fmt::format("model.arch: unknown architecture '{}' (known: gpt2, llama)", name));
}

int ModelSpec::ffn_dim() const {
    if (ffn_hidden > 0) return ffn_hidden;
    if (arch == Arch::gpt2) return 4 * n_embd;
    // LLaMA: 2/3 of 4C, rounded up to a multiple of 256 (Touvron et al. 2023).
    const int raw = 8 * n_embd / 3;
    return (raw + 255) / 256 * 256;
}

int64_t ModelSpec::qk_width() const {
    return int64_t(n_head) * (head_size() + (mla() ? qk_rope_dim : 0));
}

int64_t ModelSpec::v_width() const {
    return int64_t(n_head) * (mla() && v_head_dim > 0 ? v_head_dim : head_size());
}

int64_t ModelSpec::attn_params() const {
    const int64_t C = n_embd, Q = qk_width(), V = v_width();
    if (mla()) {
        // DeepSeek-V2 (Liu et al. 2024), Section 2.1: queries through a rank
        // q_lora_rank bottleneck (or a plain projection), keys and values
        // through a kv_lora_rank latent plus a shared rotary key.
        const int64_t q = q_lora_rank > 0 ? C * q_lora_rank + int64_t(q_lora_rank) * Q : C * Q;
        const int64_t kv = C * (kv_lora_rank + qk_rope_dim) +
                           int64_t(kv_lora_rank) * n_head * (head_size() + v_width() / n_head);
        return q + kv + V * C;
    }
    const int64_t KV = kv_dim();
    return C * Q + 2 * C * KV + V * C;
}

int64_t ModelSpec::mlp_params(int64_t width) const {
    return (arch == Arch::gpt2 ? 2 : 3) * int64_t(n_embd) * width;
}

int64_t ModelSpec::num_matmul_params() const {
    const int64_t C = n_embd, V = vocab_size, L = n_layer, E = moe_layers();
    const int64_t dense = (L - E) * (attn_params() + mlp_params(ffn_dim()));
    const int64_t experts = E * (attn_params() + C * n_expert +
                                 (n_expert + n_shared_expert) * mlp_params(expert_ffn_dim()));
    return dense + experts + V * C;  // the LM head is a matmul, tied or not
}

int64_t ModelSpec::num_active_matmul_params() const {
    const int64_t unused =
        int64_t(moe_layers()) * (n_expert - n_expert_active) * mlp_params(expert_ffn_dim());
    return num_matmul_params() - unused;
}

int64_t ModelSpec::num_params() const {
    const int64_t C = n_embd, F = ffn_dim(), V = vocab_size, L = n_layer;
    const int64_t head = tie_embeddings ? 0 : V * C;
    // Norms (and for gpt2 the biases of the plain attention and MLP).
    const int64_t norms = arch == Arch::gpt2 ? 4 * C : 2 * C;
    int64_t biases = 0, attn_biases = 0;
    if (arch == Arch::gpt2) {
        attn_biases = (qk_width() + 2 * kv_dim()) + C;
        biases = attn_biases + F + C;
    }
    // An MoE block's experts have no biases; a sigmoid router has its
    // selection bias (E).
    const int64_t E = moe_layers();
    const int64_t moe_biases = attn_biases + (moe_sigmoid ? n_expert : 0);
    const int64_t rest = num_matmul_params() - V * C;  // blocks' matmul weights
    const int64_t positions = arch == Arch::gpt2 ? int64_t(max_seq_len) * C : 0;
    const int64_t final_norm = arch == Arch::gpt2 ? 2 * C : C;
    return V * C + positions + rest + L * norms + (L - E) * biases + E * moe_biases + final_norm +
           head;
}

double ModelSpec::train_flops_per_token(int seq_len) const {
    const double attn = 6.0 * n_layer * double(seq_len) * double(qk_width() + v_width());
    return 6.0 * double(num_active_matmul_params()) + attn;
}

std::string ModelSpec::trainer_unsupported() const {
    if (mla()) return fmt::format("model.kv_lora_rank = {} (latent attention)", kv_lora_rank);
    if (head_dim > 0 && head_dim * n_head != n_embd) {
        return fmt::format("model.head_dim = {} (not n_embd / n_head)", head_dim);
    }
    return "";
}

void ModelSpec::validate() const {
    auto fail = [](const std::string& m) { throw ConfigError(m); };
    if (n_layer < 1) fail(fmt::format("model.n_layer = {}: must be at least 1", n_layer));
    if (n_embd < 1) fail(fmt::format("model.n_embd = {}: must be at least 1", n_embd));
    if (n_head < 1) fail(fmt::format("model.n_head = {}: must be at least 1", n_head));
    if (n_embd % n_head != 0)
        fail(fmt::format("model.n_head = {} does not divide model.n_embd = {}", n_head, n_embd));
    if (n_kv_head < 1 || n_head % n_kv_head != 0)
        fail(fmt::format("model.n_kv_head = {} must divide model.n_head = {}", n_kv_head, n_head));
    if (arch == Arch::gpt2 && n_kv_head != n_head)
        fail(
            fmt::format("model.n_kv_head = {} but gpt2 has no grouped-query attention: "
                        "set it to model.n_head = {}",
                        n_kv_head, n_head));
    if (arch == Arch::llama && head_size() % 2 != 0)
        fail(fmt::format("model.n_embd / model.n_head = {} must be even for RoPE", head_size()));
    if (vocab_size < 2) fail(fmt::format("model.vocab_size = {}: must be at least 2", vocab_size));
    if (max_seq_len < 1)
        fail(fmt::format("model.max_seq_len = {}: must be at least 1", max_seq_len));
    if (ffn_hidden < 0) fail(fmt::format("model.ffn_hidden = {}: must be >= 0", ffn_hidden));
    if (!(norm_eps > 0)) fail(fmt::format("model.norm_eps = {}: must be > 0", norm_eps));
    if (head_dim < 0) fail(fmt::format("model.head_dim = {}: must be >= 0", head_dim));
    if (mla() && (qk_rope_dim < 0 || v_head_dim < 0 || q_lora_rank < 0))
        fail("model.q_lora_rank, model.qk_rope_dim and model.v_head_dim must be >= 0");
    if (moe()) {
        if (n_expert_active < 1 || n_expert_active > n_expert)
            fail(fmt::format("model.n_expert_active = {} must be between 1 and model.n_expert = {}",
                             n_expert_active, n_expert));
        if (moe_dense_layers < 0 || moe_dense_layers >= n_layer)
            fail(fmt::format("model.moe_dense_layers = {} must be below model.n_layer = {}",
                             moe_dense_layers, n_layer));
        if (n_shared_expert < 0 || moe_ffn_hidden < 0)
            fail("model.n_shared_expert and model.moe_ffn_hidden must be >= 0");
        if (!(moe_capacity_factor > 0 && moe_capacity_factor <= 1000))
            fail(fmt::format(
                "model.moe_capacity_factor = {}: must be in (0, 1000] (1.0: each expert takes "
                "its even share of a micro-batch's choices; or set model.moe_dropless = true)",
                moe_capacity_factor));
        if (!(moe_aux_loss_coef >= 0 && moe_aux_loss_coef <= 100))
            fail(fmt::format("model.moe_aux_loss_coef = {}: must be in [0, 100] (0: off; "
                             "Switch Transformer uses 0.01)",
                             moe_aux_loss_coef));
        if (!(moe_z_loss_coef >= 0 && moe_z_loss_coef <= 100))
            fail(fmt::format("model.moe_z_loss_coef = {}: must be in [0, 100] (0: off; "
                             "ST-MoE uses 0.001)",
                             moe_z_loss_coef));
    } else if (n_expert_active > 0 || n_shared_expert > 0 || moe_dense_layers > 0 ||
               moe_ffn_hidden > 0 || moe_sigmoid || moe_dropless) {
        fail(
            "model.n_expert_active, n_shared_expert, moe_ffn_hidden, moe_dense_layers, "
            "moe_router and moe_dropless describe experts: set model.n_expert too (or leave "
            "them at their defaults)");
    }
}

namespace {

ModelSpec gpt2(int L, int C, int NH, int V = 50257, int T = 1024) {
    ModelSpec s;
    s.arch = Arch::gpt2;
    s.n_layer = L, s.n_embd = C, s.n_head = NH, s.n_kv_head = NH;
    s.vocab_size = V, s.max_seq_len = T;
    s.tie_embeddings = true;
    return s;
}

ModelSpec llama(int L, int C, int NH, int KV, int F, int V, int T, float theta = 10000.0f,
                float eps = 1e-5f) {
    ModelSpec s;
    s.arch = Arch::llama;
    s.n_layer = L, s.n_embd = C, s.n_head = NH, s.n_kv_head = KV, s.ffn_hidden = F;
    s.vocab_size = V, s.max_seq_len = T;
    s.tie_embeddings = false;
    s.rope_theta = theta;
    s.norm_eps = eps;
    return s;
}

const std::map<std::string, ModelSpec>& presets() {
    static const std::map<std::string, ModelSpec> table = [] {
        std::map<std::string, ModelSpec> t;
        // The default main job: a byte-level GPT that trains in minutes on 2 cores.
        t["tiny"] = gpt2(4, 192, 6, 256, 256);
        t["tiny-llama"] = llama(4, 192, 6, 2, 512, 256, 256);
        // GPT-2 (Radford et al. 2019), Hugging Face configs.
        t["gpt2-124m"] = gpt2(12, 768, 12);
        t["gpt2-350m"] = gpt2(24, 1024, 16);
        t["gpt2-774m"] = gpt2(36, 1280, 20);
        t["gpt2-1558m"] = gpt2(48, 1600, 25);
        // GPT-3 (Brown et al. 2020, Table 2.1), context 2048.
        t["gpt3-125m"] = gpt2(12, 768, 12, 50257, 2048);
        t["gpt3-1.3b"] = gpt2(24, 2048, 16, 50257, 2048);
        t["gpt3-2.7b"] = gpt2(32, 2560, 32, 50257, 2048);
        t["gpt3-6.7b"] = gpt2(32, 4096, 32, 50257, 2048);
        t["gpt3-13b"] = gpt2(40, 5120, 40, 50257, 2048);
        t["gpt3-175b"] = gpt2(96, 12288, 96, 50257, 2048);
        // Other published GPT-style runs, for the planner (positions are
        // modelled as learned even where the original used ALiBi).
        t["opt-175b"] = gpt2(96, 12288, 96, 50272, 2048);       // Zhang et al. 2022
        t["bloom-176b"] = gpt2(70, 14336, 112, 250880, 2048);   // BigScience 2022
        t["mt-nlg-530b"] = gpt2(105, 20480, 128, 51200, 2048);  // Smith et al. 2022
        // LLaMA 60M as in the GaLore paper (Zhao et al. 2024, Table 9).
        t["llama-60m"] = llama(8, 512, 8, 8, 1376, 32000, 256);
        // LLaMA 2 (Touvron et al. 2023) and LLaMA 3 (Meta 2024) model cards.
        t["llama2-7b"] = llama(32, 4096, 32, 32, 11008, 32000, 4096);
        t["llama2-13b"] = llama(40, 5120, 40, 40, 13824, 32000, 4096);
        t["llama2-70b"] = llama(80, 8192, 64, 8, 28672, 32000, 4096);
        t["llama3-8b"] = llama(32, 4096, 32, 8, 14336, 128256, 8192, 500000.0f);
        t["llama3-70b"] = llama(80, 8192, 64, 8, 28672, 128256, 8192, 500000.0f);
        t["llama3-405b"] = llama(126, 16384, 128, 8, 53248, 128256, 8192, 500000.0f);
        return t;
    }();
    return table;
}

}  // namespace

const ModelSpec* find_preset(const std::string& name) {
    auto it = presets().find(name);
    return it == presets().end() ? nullptr : &it->second;
}

const ModelSpec& preset(const std::string& name) {
    if (const ModelSpec* s = find_preset(name)) return *s;
    throw ConfigError(fmt::format("model.preset: unknown preset '{}' (known: {})", name,
                                  fmt::join(preset_names(), ", ")));
}

std::vector<std::string> preset_names() {
    std::vector<std::string> names;
    for (const auto& [name, spec] : presets()) names.push_back(name);
    return names;
}

}  // namespace apiary::core
