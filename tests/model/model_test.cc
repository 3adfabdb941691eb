#include <gtest/gtest.h>

#include <vector>

#include "core/error.h"
#include "core/model_spec.h"
#include "model/model.h"

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
