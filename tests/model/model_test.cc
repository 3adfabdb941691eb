#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/model_spec.h"
#include "model/model.h"
#include "optim/adamw.h"

using namespace apiary;

TEST(Transformer, RegistryMatchesSpecParamCount) {
    for (const char* name : {"tiny", "tiny-llama", "gpt2-124m"}) {
        const auto& spec = core::preset(name);
        model::Transformer m(spec, 1, 8);
        EXPECT_EQ(m.registry().num_params(), spec.num_params()) << name;
    }
}

TEST(Transformer, InitIsDeterministicAndSeedDependent) {
    const auto& spec = core::preset("tiny-llama");
    model::Transformer a(spec, 1, 8), b(spec, 1, 8), c(spec, 1, 8);
    a.init(7);
    b.init(7);
    c.init(8);
    const size_t bytes = size_t(a.flat_size()) * 4;
    EXPECT_EQ(std::memcmp(a.params(), b.params(), bytes), 0);
    EXPECT_NE(std::memcmp(a.params(), c.params(), bytes), 0);
}

TEST(Transformer, RejectsTokensOutsideVocabulary) {
    model::Transformer m(core::preset("tiny"), 1, 4);
    m.init(1);
    const std::vector<int32_t> tok = {1, 2, 300, 4};
    const std::vector<int32_t> tgt = {2, 3, 4, 5};
    EXPECT_THROW(m.forward_backward(tok.data(), tgt.data(), 1, 4, 1.0f), DataError);
}

TEST(Transformer, RejectsSequenceLongerThanModel) {
    EXPECT_THROW(model::Transformer(core::preset("tiny"), 1, 100000), ConfigError);
}

TEST(Transformer, EvaluateMatchesTrainingLoss) {
    model::Transformer m(core::preset("tiny-llama"), 2, 16);
    m.init(3);
    std::vector<int32_t> tok(32), tgt(32);
    for (int i = 0; i < 32; ++i) tok[i] = (i * 37) % 256, tgt[i] = (i * 11 + 5) % 256;
    const auto e = m.evaluate(tok.data(), tgt.data(), 2, 16);
    const auto t = m.forward_backward(tok.data(), tgt.data(), 2, 16, 1.0f);
    EXPECT_EQ(e.count, t.count);
    EXPECT_NEAR(e.loss_sum, t.loss_sum, 1e-5 * t.loss_sum);
}

// bf16: the weight copy written by the optimizer's step is the copy a cast
// after the step would make, so training is bit-identical either way.
TEST(Transformer, Bf16CopyWrittenByTheOptimizerEqualsARecast) {
    const auto& spec = core::preset("tiny");
    model::Transformer fused(spec, 2, 16, model::Precision::bf16),
        recast(spec, 2, 16, model::Precision::bf16);
    std::vector<optim::ParamRange> ranges;
    for (const auto& e : fused.registry().entries()) ranges.push_back({e.offset, e.numel(), e.decay});
    optim::AdamW opt_fused(ranges, fused.flat_size(), {}), opt_recast(ranges, recast.flat_size(), {});
    ASSERT_TRUE(opt_fused.updates_all_params());
    fused.init(4);
    recast.init(4);
    std::vector<int32_t> tok(32), tgt(32);
    for (int i = 0; i < 32; ++i) tok[i] = (i * 37) % 256, tgt[i] = (i * 11 + 5) % 256;
    for (int step = 0; step < 3; ++step) {
        fused.zero_grads();
        recast.zero_grads();
        const auto a = fused.forward_backward(tok.data(), tgt.data(), 2, 16, 1.0f / 32);
        const auto b = recast.forward_backward(tok.data(), tgt.data(), 2, 16, 1.0f / 32);
        EXPECT_EQ(a.loss_sum, b.loss_sum) << "step " << step;
        opt_fused.step(fused.params(), fused.grads(), 1e-3f, 1.0f, -1.0, fused.bf16_weights());
        fused.bf16_weights_written();
        opt_recast.step(recast.params(), recast.grads(), 1e-3f);  // recast at the next forward
    }
    EXPECT_EQ(std::memcmp(fused.params(), recast.params(), size_t(fused.flat_size()) * 4), 0);
    // A sharded optimizer does not update every parameter: no fused copy.
    EXPECT_FALSE(optim::AdamW(ranges, fused.flat_size(), {}, 0, fused.flat_size() / 2)
                     .updates_all_params());
    std::vector<optim::ParamRange> gap(ranges.begin() + 1, ranges.end());
    EXPECT_FALSE(optim::AdamW(gap, fused.flat_size(), {}).updates_all_params());
    EXPECT_EQ(model::Transformer(spec, 1, 8).bf16_weights(), nullptr);  // fp32: no copy
}
