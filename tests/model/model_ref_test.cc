// GPT-2 and LLaMA against the PyTorch reference in tools/ref/model_ref.py:
// logits, loss and every parameter gradient within 1e-5 relative, and the
// losses of 10 AdamW steps within 1e-4. The reference runs at test time on
// apiary's own initial parameters and batches, in float64.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "ckpt/safetensors.h"
#include "core/model_spec.h"
#include "core/rng.h"
#include "model/model.h"
#include "optim/adamw.h"

using namespace apiary;
namespace fs = std::filesystem;

namespace {

constexpr double kTol = 1e-5;
constexpr double kLossCurveTol = 1e-4;

// Debian's python3-torch is installed for the system interpreter.
std::string python() {
    if (const char* p = std::getenv("APIARY_PYTHON")) return p;
    return "/usr/bin/python3";
}

double rel_err(const float* a, const std::vector<double>& b) {
    double num = 0, den = 1e-30;
    for (size_t i = 0; i < b.size(); ++i) {
        num = std::max(num, std::fabs(double(a[i]) - b[i]));
        den = std::max(den, std::fabs(b[i]));
    }
    return num / den;
}

struct Case {
    core::ModelSpec spec;
    int B, T, steps;
};

// The reference needs PyTorch; without it the comparison is skipped, not
// passed.
bool have_torch() {
    static const bool ok =
        std::system((python() + " -c 'import torch' >/dev/null 2>&1").c_str()) == 0;
    return ok;
}

void run_case(const Case& c, const std::string& label) {
    if (!have_torch()) GTEST_SKIP() << python() << " has no torch (Debian: python3-torch)";
    const fs::path dir = fs::temp_directory_path() / ("apiary_ref_" + label + "_" +
                                                      std::to_string(::getpid()));
    fs::create_directories(dir);
    model::Transformer m(c.spec, c.B, c.T);
    m.init(1234);
    const optim::AdamWOptions opt{0.9f, 0.95f, 1e-8f, 0.1f, 1.0f};
    const float lr = 1e-3f;

    // Batches: random tokens; targets are the next token, with some ignored.
    const int64_t n = int64_t(c.B) * c.T;
    std::vector<int32_t> tokens(size_t(c.steps) * n), targets(size_t(c.steps) * n);
    core::Philox rng(99, 1);
    for (size_t i = 0; i < tokens.size(); ++i) {
        tokens[i] = int32_t(rng.below(2 * i, c.spec.vocab_size));
        targets[i] = (i % 7 == 3) ? -1 : int32_t(rng.below(2 * i + 1, c.spec.vocab_size));
    }
    std::vector<ckpt::TensorEntry> pt;
    for (const auto& e : m.registry().entries()) {
        pt.push_back({e.name, "F32", e.shape, m.params() + e.offset, size_t(e.numel()) * 4});
    }
    ckpt::write_safetensors((dir / "params.safetensors").string(), pt, {});
    const std::vector<int64_t> bshape = {c.steps, c.B, c.T};
    ckpt::write_safetensors((dir / "batch.safetensors").string(),
                            {{"tokens", "I32", bshape, tokens.data(), tokens.size() * 4},
                             {"targets", "I32", bshape, targets.data(), targets.size() * 4}},
                            {});
    const auto& s = c.spec;
    nlohmann::json cfg = {{"arch", core::arch_name(s.arch)}, {"n_layer", s.n_layer},
                          {"n_embd", s.n_embd}, {"n_head", s.n_head},
                          {"n_kv_head", s.n_kv_head}, {"vocab_size", s.vocab_size},
                          {"tie_embeddings", s.tie_embeddings}, {"norm_eps", s.norm_eps},
                          {"rope_theta", s.rope_theta}, {"steps", c.steps}, {"lr", lr},
                          {"beta1", opt.beta1}, {"beta2", opt.beta2}, {"eps", opt.eps},
                          {"weight_decay", opt.weight_decay}, {"grad_clip", opt.grad_clip},
                          {"n_expert", s.n_expert}, {"n_expert_active", s.n_expert_active},
                          {"n_shared_expert", s.n_shared_expert},
                          {"moe_dense_layers", s.moe_dense_layers},
                          {"moe_router", s.moe_sigmoid ? "sigmoid" : "softmax"},
                          {"moe_dropless", s.moe_dropless},
                          {"moe_capacity_factor", s.moe_capacity_factor},
                          {"moe_aux_loss_coef", s.moe_aux_loss_coef},
                          {"moe_z_loss_coef", s.moe_z_loss_coef}};
    std::ofstream(dir / "config.json") << cfg.dump();
    const std::string cmd = python() + " " + APIARY_SOURCE_DIR + "/tools/ref/model_ref.py " +
                            dir.string();
    ASSERT_EQ(std::system(cmd.c_str()), 0) << "reference failed: " << cmd;
    const ckpt::SafetensorsFile ref((dir / "ref.safetensors").string());

    // Logits.
    std::vector<float> logits(size_t(n) * s.vocab_size);
    m.forward_logits(logits.data(), tokens.data(), c.B, c.T);
    EXPECT_LT(rel_err(logits.data(), ref.read_as_f64("logits")), kTol) << "logits";

    // Loss and gradients of the mean loss.
    int64_t count = 0;
    for (int64_t i = 0; i < n; ++i) count += targets[i] >= 0;
    m.zero_grads();
    const auto r = m.forward_backward(tokens.data(), targets.data(), c.B, c.T, 1.0f / float(count));
    EXPECT_EQ(r.count, count);
    const double ref_loss = ref.read_as_f64("loss")[0];
    EXPECT_NEAR(r.mean(), ref_loss, kTol * ref_loss);
    for (const auto& e : m.registry().entries()) {
        EXPECT_LT(rel_err(m.grads() + e.offset, ref.read_as_f64("grad." + e.name)), kTol)
            << "gradient of " << e.name;
    }

    // Ten AdamW steps with clipping and weight decay only on matrices.
    std::vector<optim::ParamRange> ranges;
    for (const auto& e : m.registry().entries()) {
        ranges.push_back({e.offset, e.numel(), e.shape.size() >= 2});
    }
    optim::AdamW adam(ranges, m.flat_size(), opt);
    const auto ref_losses = ref.read_as_f64("losses");
    for (int step = 0; step < c.steps; ++step) {
        int64_t cnt = 0;
        for (int64_t i = 0; i < n; ++i) cnt += targets[step * n + i] >= 0;
        m.zero_grads();
        const auto res = m.forward_backward(tokens.data() + step * n, targets.data() + step * n,
                                            c.B, c.T, 1.0f / float(cnt));
        adam.step(m.params(), m.grads(), lr);
        EXPECT_NEAR(res.mean(), ref_losses[step], kLossCurveTol * ref_losses[step])
            << "step " << step;
    }
    fs::remove_all(dir);
}

}  // namespace

TEST(ModelVsPyTorch, Gpt2) {
    core::ModelSpec s;
    s.arch = core::Arch::gpt2;
    s.n_layer = 2, s.n_embd = 36, s.n_head = 3, s.n_kv_head = 3;
    s.vocab_size = 53, s.max_seq_len = 80, s.tie_embeddings = true;
    run_case({s, 3, 70, 10}, "gpt2");
}

TEST(ModelVsPyTorch, LlamaWithGqa) {
    core::ModelSpec s;
    s.arch = core::Arch::llama;
    s.n_layer = 2, s.n_embd = 48, s.n_head = 4, s.n_kv_head = 2, s.ffn_hidden = 52;
    s.vocab_size = 61, s.max_seq_len = 80, s.tie_embeddings = false;
    s.rope_theta = 10000.0f;
    run_case({s, 2, 67, 10}, "llama");
}

// Mixture of experts: the router (softmax or sigmoid with its selection
// bias), the capacity cut, shared experts, dense leading blocks, and the
// balance and z losses in every gradient. Coefficients well above the
// defaults so that a wrong router-loss gradient shows at 1e-5.
TEST(ModelVsPyTorch, Gpt2MoeTop2WithCapacityAndSharedExpert) {
    core::ModelSpec s;
    s.arch = core::Arch::gpt2;
    s.n_layer = 3, s.n_embd = 24, s.n_head = 2, s.n_kv_head = 2;
    s.vocab_size = 41, s.max_seq_len = 40, s.tie_embeddings = true;
    s.n_expert = 4, s.n_expert_active = 2, s.n_shared_expert = 1, s.moe_ffn_hidden = 20;
    s.moe_dense_layers = 1, s.moe_capacity_factor = 1.0f;
    s.moe_aux_loss_coef = 0.1f, s.moe_z_loss_coef = 0.01f;
    run_case({s, 3, 23, 10}, "gpt2_moe");
}

TEST(ModelVsPyTorch, LlamaMoeTop1SigmoidRouter) {
    core::ModelSpec s;
    s.arch = core::Arch::llama;
    s.n_layer = 2, s.n_embd = 32, s.n_head = 4, s.n_kv_head = 2, s.ffn_hidden = 40;
    s.vocab_size = 37, s.max_seq_len = 40, s.tie_embeddings = false;
    s.n_expert = 3, s.n_expert_active = 1, s.moe_ffn_hidden = 24;
    s.moe_sigmoid = true, s.moe_capacity_factor = 1.25f;
    s.moe_aux_loss_coef = 0.1f, s.moe_z_loss_coef = 0.01f;
    run_case({s, 2, 29, 10}, "llama_moe");
}

TEST(ModelVsPyTorch, LlamaMoeTop2DroplessSoftmax) {
    core::ModelSpec s;
    s.arch = core::Arch::llama;
    s.n_layer = 2, s.n_embd = 32, s.n_head = 4, s.n_kv_head = 4, s.ffn_hidden = 40;
    s.vocab_size = 37, s.max_seq_len = 40, s.tie_embeddings = false;
    s.n_expert = 5, s.n_expert_active = 2, s.n_shared_expert = 2, s.moe_ffn_hidden = 16;
    s.moe_dropless = true, s.moe_aux_loss_coef = 0.1f, s.moe_z_loss_coef = 0.01f;
    run_case({s, 2, 31, 10}, "llama_moe_dropless");
}
