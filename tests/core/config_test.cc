#include <gtest/gtest.h>

#include "core/config.h"
#include "core/error.h"
#include "core/model_spec.h"

using namespace apiary;
using namespace apiary::core;

namespace {

Schema test_schema() {
    Schema s;
    add_shared_keys(s);
    s.add_real("train.lr", 3e-4, "peak learning rate", 0.0, 10.0);
    s.add_bool("train.flag", false, "a flag");
    return s;
}

std::string error_of(auto&& fn) {
    try {
        fn();
    } catch (const ConfigError& e) {
        return e.what();
    }
    return "";
}

}  // namespace

TEST(Config, DefaultsAndOverrides) {
    const Schema s = test_schema();
    Config c(s);
    EXPECT_EQ(c.get_int("train.batch_size"), 16);
    EXPECT_FALSE(c.is_set("train.batch_size"));
    c.set("train.batch_size=16");
    c.set("train.lr=1e-3");
    c.set("train.flag=true");
    EXPECT_EQ(c.get_int("train.batch_size"), 16);
    EXPECT_DOUBLE_EQ(c.get_real("train.lr"), 1e-3);
    EXPECT_TRUE(c.get_bool("train.flag"));
    EXPECT_TRUE(c.is_set("train.batch_size"));
}

TEST(Config, UnknownKeySuggestsNearest) {
    const Schema s = test_schema();
    Config c(s);
    const std::string msg = error_of([&] { c.set("train.batch_sise=4"); });
    EXPECT_NE(msg.find("unknown config key 'train.batch_sise'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("did you mean 'train.batch_size'"), std::string::npos) << msg;
}

TEST(Config, WrongTypeNamesKeyAndSource) {
    const Schema s = test_schema();
    Config c(s);
    const std::string msg =
        error_of([&] { c.load_string("[train]\nbatch_size = \"big\"\n", "run.toml"); });
    EXPECT_NE(msg.find("run.toml:2"), std::string::npos) << msg;
    EXPECT_NE(msg.find("train.batch_size must be an integer"), std::string::npos) << msg;
}

TEST(Config, OutOfRangeAndChoices) {
    const Schema s = test_schema();
    Config c(s);
    EXPECT_NE(error_of([&] { c.set("train.batch_size=0"); }).find("out of range"),
              std::string::npos);
    EXPECT_NE(error_of([&] { c.set("train.precision=fp4"); }).find("not one of"),
              std::string::npos);
    EXPECT_NE(error_of([&] { c.set("train.lr=abc"); }).find("must be a number"),
              std::string::npos);
    EXPECT_NE(error_of([&] { c.set("novalue"); }).find("expected key=value"), std::string::npos);
}

TEST(Config, TomlErrorsCarryLineAndColumn) {
    const Schema s = test_schema();
    Config c(s);
    const std::string msg = error_of([&] { c.load_string("[train]\nbatch_size = = 3\n", "x.toml"); });
    EXPECT_NE(msg.find("x.toml:2:"), std::string::npos) << msg;
}

TEST(Config, RoundTripsThroughToml) {
    const Schema s = test_schema();
    Config a(s);
    a.set("train.lr=0.125");
    a.set("model.preset=gpt2-124m");
    a.set("train.flag=true");
    Config b(s);
    b.load_string(a.to_toml(), "roundtrip");
    EXPECT_EQ(a.hash(), b.hash());
    EXPECT_DOUBLE_EQ(b.get_real("train.lr"), 0.125);
    EXPECT_EQ(b.get_string("model.preset"), "gpt2-124m");
}

TEST(Config, HashChangesWithAnyValue) {
    const Schema s = test_schema();
    Config a(s), b(s);
    EXPECT_EQ(a.hash(), b.hash());
    b.set("train.seq_len=129");
    EXPECT_NE(a.hash(), b.hash());
}

TEST(Config, ModelSpecFromPresetAndOverrides) {
    const Schema s = test_schema();
    Config c(s);
    c.set("model.preset=gpt2-124m");
    c.set("model.n_layer=2");
    const ModelSpec m = model_spec_from(c);
    EXPECT_EQ(m.n_layer, 2);
    EXPECT_EQ(m.n_embd, 768);
    c.set("model.n_head=5");
    const std::string msg = error_of([&] { model_spec_from(c); });
    EXPECT_NE(msg.find("model.n_head = 5 does not divide model.n_embd = 768"), std::string::npos)
        << msg;
}
