// Mixture-of-experts blocks in the model: the parameter count the planner
// uses, the expert-load statistics, the load-balancing loss doing its job
// on a skewed input, and bad settings refused naming the key and value.
// (Loss and gradients against PyTorch: model_ref_test.cc.)

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "core/model_spec.h"
#include "core/rng.h"
#include "model/model.h"
#include "optim/adamw.h"

using namespace apiary;

namespace {

core::ModelSpec moe_spec(core::Arch arch) {
    core::ModelSpec s;
    s.arch = arch;
    s.n_layer = 2, s.n_embd = 32, s.n_head = 2, s.n_kv_head = 2;
    s.vocab_size = 16, s.max_seq_len = 32, s.tie_embeddings = arch == core::Arch::gpt2;
    s.n_expert = 4, s.n_expert_active = 1, s.moe_ffn_hidden = 32;
    return s;
}

std::string message_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    return "(no error)";
}

// max / mean of the tokens routed to each expert of block `layer`.
double imbalance(const model::MoeLayerStats& st) {
    const double total = double(std::accumulate(st.routed.begin(), st.routed.end(), int64_t(0)));
    const double most = double(*std::max_element(st.routed.begin(), st.routed.end()));
    return most / (total / double(st.routed.size()));
}

// Trains a top-1 model on a skewed batch (nine tokens in ten are token 3,
// whose embedding is scaled up so that it dominates the router's input:
// at the start almost every token goes to one expert) and returns the
// first block's max/mean load over the last 10 of 40 steps.
double trained_imbalance(float aux_coef) {
    core::ModelSpec s = moe_spec(core::Arch::gpt2);
    s.moe_dropless = true;
    s.moe_aux_loss_coef = aux_coef;
    s.moe_z_loss_coef = 0.0f;
    const int B = 4, T = 32, N = B * T;
    model::Transformer m(s, B, T);
    m.init(5);
    float* wte = m.params() + m.registry().get("wte.weight").offset;
    for (int c = 0; c < s.n_embd; ++c) wte[3 * s.n_embd + c] *= 20.0f;
    std::vector<int32_t> tokens(N), targets(N);
    core::Philox rng(17, 2);
    for (int i = 0; i < N; ++i) {
        tokens[size_t(i)] = rng.below(uint64_t(i), 10) == 0 ? int32_t(rng.below(uint64_t(i) + 9999, 16)) : 3;
    }
    for (int i = 0; i < N; ++i) targets[size_t(i)] = tokens[size_t((i + 1) % N)];
    std::vector<optim::ParamRange> ranges;
    for (const auto& e : m.registry().entries()) ranges.push_back({e.offset, e.numel(), e.decay});
    optim::AdamW adam(ranges, m.flat_size(), {0.9f, 0.95f, 1e-8f, 0.0f, 1.0f});
    for (int step = 0; step < 40; ++step) {
        if (step == 30) m.reset_moe_stats();
        m.zero_grads();
        m.forward_backward(tokens.data(), targets.data(), B, T, 1.0f / float(N));
        adam.step(m.params(), m.grads(), 1e-2f);
    }
    EXPECT_EQ(m.moe_stats()[0].batches, 10);
    return imbalance(m.moe_stats()[0]);
}

}  // namespace

TEST(Moe, RegistryMatchesSpecParamCount) {
    for (const auto arch : {core::Arch::gpt2, core::Arch::llama}) {
        for (const bool sigmoid : {false, true}) {
            core::ModelSpec s = moe_spec(arch);
            s.n_layer = 3, s.moe_dense_layers = 1, s.n_shared_expert = 2, s.moe_sigmoid = sigmoid;
            model::Transformer m(s, 1, 8);
            EXPECT_EQ(m.registry().num_params(), s.num_params()) << core::arch_name(arch);
            EXPECT_EQ(m.registry().find("h.0.mlp.gate.weight"), nullptr);  // a dense block
            EXPECT_EQ(m.moe_stats().size(), 2u);
        }
    }
}

TEST(Moe, StatsCountEveryChoiceOfTrainingPassesOnly) {
    core::ModelSpec s = moe_spec(core::Arch::llama);
    s.n_expert_active = 2, s.moe_capacity_factor = 0.5f;
    const int B = 2, T = 16, N = B * T;
    model::Transformer m(s, B, T);
    m.init(1);
    std::vector<int32_t> tok(N), tgt(N);
    for (int i = 0; i < N; ++i) tok[size_t(i)] = i % 16, tgt[size_t(i)] = (i + 1) % 16;
    m.evaluate(tok.data(), tgt.data(), B, T);
    EXPECT_EQ(m.moe_stats()[0].batches, 0);  // evaluation does not count
    m.forward_backward(tok.data(), tgt.data(), B, T, 1.0f / N);
    m.forward_backward(tok.data(), tgt.data(), B, T, 1.0f / N);
    for (const auto& st : m.moe_stats()) {
        EXPECT_EQ(st.batches, 2);
        EXPECT_EQ(std::accumulate(st.routed.begin(), st.routed.end(), int64_t(0)), 2 * N * 2);
        // capacity ceil(0.5 * 32 * 2 / 4) = 8 per expert: 32 of 64 choices
        // kept per pass at most, so at least half are dropped.
        const int64_t dropped = std::accumulate(st.dropped.begin(), st.dropped.end(), int64_t(0));
        EXPECT_GE(dropped, 2 * 32);
        EXPECT_GT(st.aux_sum, 0.0);
    }
}

TEST(Moe, AuxLossBalancesExpertLoadOnSkewedInput) {
    const double without = trained_imbalance(0.0f);
    const double with = trained_imbalance(0.5f);
    std::printf("  max/mean expert load: %.2f without the aux loss, %.2f with it\n", without, with);
    // Without it the router keeps sending the dominant token to one expert.
    EXPECT_GT(without, 2.5);
    EXPECT_LT(with, 0.7 * without);
}

TEST(Moe, BadSettingsAreRefusedNamingKeyAndValue) {
    core::ModelSpec s = moe_spec(core::Arch::gpt2);
    s.n_expert_active = 5;
    EXPECT_NE(message_of([&] { s.validate(); })
                  .find("model.n_expert_active = 5 must be between 1 and model.n_expert = 4"),
              std::string::npos);
    s = moe_spec(core::Arch::gpt2);
    s.moe_capacity_factor = 0.0f;
    EXPECT_NE(message_of([&] { s.validate(); }).find("model.moe_capacity_factor = 0: must be in (0"),
              std::string::npos);
    s = moe_spec(core::Arch::gpt2);
    s.moe_aux_loss_coef = -1.0f;
    EXPECT_NE(message_of([&] { s.validate(); }).find("model.moe_aux_loss_coef = -1"),
              std::string::npos);
    s = moe_spec(core::Arch::gpt2);
    s.moe_z_loss_coef = 1000.0f;
    EXPECT_NE(message_of([&] { s.validate(); }).find("model.moe_z_loss_coef = 1000"),
              std::string::npos);
    s = moe_spec(core::Arch::gpt2);
    s.n_expert = 0, s.n_expert_active = 0, s.moe_ffn_hidden = 0, s.moe_sigmoid = true;
    EXPECT_NE(message_of([&] { s.validate(); }).find("set model.n_expert too"), std::string::npos);
    EXPECT_NE(message_of([&] {
                  model::Transformer m(moe_spec(core::Arch::gpt2), 1, 8, model::Precision::fp16);
              }).find("train.precision = fp32 or bf16 (not fp16)"),
              std::string::npos);
    model::ModelOptions o;
    o.shard.tp_size = 2;
    EXPECT_NE(message_of([&] { model::Transformer m(moe_spec(core::Arch::gpt2), 1, 8, o); })
                  .find("parallel.tp = 1 only"),
              std::string::npos);
}

TEST(Moe, RouterSendingEveryTokenToOneExpertStaysWithinCapacity) {
    // All tokens identical (llama has no positions): every choice goes to
    // one expert. Capacity drops the excess; dropless takes them all; the
    // buffers hold N K rows either way, so neither runs out of room.
    for (const bool dropless : {false, true}) {
        core::ModelSpec s = moe_spec(core::Arch::llama);
        s.moe_dropless = dropless;
        const int B = 2, T = 16, N = B * T;
        model::Transformer m(s, B, T);
        m.init(2);
        std::vector<int32_t> tok(N, 5), tgt(N, 6);
        const auto r = m.forward_backward(tok.data(), tgt.data(), B, T, 1.0f / N);
        EXPECT_TRUE(std::isfinite(r.mean()));
        const auto& st = m.moe_stats()[0];
        EXPECT_EQ(*std::max_element(st.routed.begin(), st.routed.end()), N);
        const int64_t dropped = std::accumulate(st.dropped.begin(), st.dropped.end(), int64_t(0));
        EXPECT_EQ(dropped, dropless ? 0 : N - 10);  // capacity ceil(1.25 * 32 / 4) = 10
    }
}

TEST(Moe, RecomputedBlocksGiveTheSameGradientsAndCounts) {
    // Full recomputation runs the MoE forward again inside backward: the
    // same routing, the same gradients bit for bit, each choice counted once.
    core::ModelSpec s = moe_spec(core::Arch::gpt2);
    s.n_expert_active = 2, s.n_shared_expert = 1;
    const int B = 2, T = 16, N = B * T;
    std::vector<int32_t> tok(N), tgt(N);
    for (int i = 0; i < N; ++i) tok[size_t(i)] = (i * 7) % 16, tgt[size_t(i)] = (i * 3 + 1) % 16;
    std::vector<std::vector<float>> grads;
    std::vector<int64_t> counted;
    for (const auto mode : {core::Recompute::none, core::Recompute::full}) {
        model::ModelOptions o;
        o.shard.recompute = mode;
        model::Transformer m(s, B, T, o);
        m.init(3);
        m.zero_grads();
        m.forward_backward(tok.data(), tgt.data(), B, T, 1.0f / N);
        grads.emplace_back(m.grads(), m.grads() + m.flat_size());
        const auto& r = m.moe_stats()[0].routed;
        counted.push_back(std::accumulate(r.begin(), r.end(), int64_t(0)));
    }
    EXPECT_EQ(grads[0], grads[1]);
    EXPECT_EQ(counted[0], N * 2);
    EXPECT_EQ(counted[1], N * 2);
}
