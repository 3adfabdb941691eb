#include <gtest/gtest.h>

#include "core/error.h"
#include "core/model_spec.h"

using namespace apiary::core;

// Published parameter counts, computed from the same shapes.
TEST(ModelSpec, Gpt2ParamCountsMatchHuggingFace) {
    // GPT2LMHeadModel.num_parameters() for "gpt2" and "gpt2-medium".
    EXPECT_EQ(preset("gpt2-124m").num_params(), 124439808);
    EXPECT_EQ(preset("gpt2-350m").num_params(), 354823168);
}

TEST(ModelSpec, Llama2ParamCountMatchesModelCard) {
    // Llama-2-7b-hf: 6,738,415,616 parameters.
    EXPECT_EQ(preset("llama2-7b").num_params(), 6738415616);
    // Meta-Llama-3-8B: 8,030,261,248 parameters.
    EXPECT_EQ(preset("llama3-8b").num_params(), 8030261248);
}

TEST(ModelSpec, TrainFlopsAreSixNPlusAttention) {
    const ModelSpec& s = preset("gpt2-124m");
    const double expect = 6.0 * double(s.num_matmul_params()) + 12.0 * 12 * 1024 * 768;
    EXPECT_DOUBLE_EQ(s.train_flops_per_token(1024), expect);
}

TEST(ModelSpec, UnknownPresetListsKnownOnes) {
    try {
        preset("gpt5");
        FAIL();
    } catch (const apiary::ConfigError& e) {
        EXPECT_NE(std::string(e.what()).find("gpt2-124m"), std::string::npos);
    }
}

TEST(ModelSpec, ValidateRejectsBadGqa) {
    ModelSpec s = preset("tiny-llama");
    s.n_kv_head = 4;  // 6 heads are not a multiple of 4
    EXPECT_THROW(s.validate(), apiary::ConfigError);
}
