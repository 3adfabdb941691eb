// The validation set (tests/plan/validation.toml): published runs, each with
// its source, scored by the planner. Every run must be describable; the
// catalog's fitted constants must be what the fit split gives; and the
// errors must stay where BENCHMARKS.md records them.

#include <gtest/gtest.h>

#include <fstream>
#include <set>

#include "core/error.h"
#include "plan/validate.h"
#include "test_util.h"

namespace apiary::plan {
namespace {

const std::string kFile = std::string(APIARY_SOURCE_DIR) + "/tests/plan/validation.toml";

const std::vector<ValidationRun>& runs() {
    static const auto r = read_validation(kFile);
    return r;
}

TEST(PlanValidation, EveryRunIsDescribedAndSourced) {
    ASSERT_GE(runs().size(), 80u);
    std::set<std::string> devices, impls, names;
    int fit = 0, moe = 0, fp8 = 0, cp = 0, memory = 0;
    for (const auto& r : runs()) {
        EXPECT_TRUE(names.insert(r.name).second) << "duplicate " << r.name;
        EXPECT_GT(r.source.size(), 20u) << r.name;
        fit += r.split == "fit";
        const PlanInput in = test::input(r.sets);  // throws if not describable
        devices.insert(in.c.dev.name);
        impls.insert(impl_name(in.c.impl));
        moe += in.w.model.moe();
        fp8 += in.w.dtype == Dtype::fp8;
        cp += in.l.cp > 1;
        memory += r.measured.count("memory_gib") > 0;
    }
    EXPECT_GT(fit, 10);
    EXPECT_GT(int(runs().size()) - fit, 40);
    for (const char* d :
         {"A100-80GB", "H100-SXM", "H800", "B200", "V100-32GB", "Gaudi2", "TPUv3"}) {
        EXPECT_TRUE(devices.count(d)) << d;
    }
    for (const char* i : {"megatron", "megatron-2019", "deepspeed", "fsdp"}) {
        EXPECT_TRUE(impls.count(i)) << i;
    }
    EXPECT_GE(moe, 10);
    EXPECT_GE(fp8, 20);
    EXPECT_GE(cp, 8);
    EXPECT_GE(memory, 10);
}

// The constants in the catalog and the implementation profiles are the ones
// the fit split gives (rounded to two digits): nothing was tuned on held-out
// runs.
TEST(PlanValidation, CatalogConstantsAreTheFit) {
    const Constants k = fit_constants(runs(), test::schema());
    int fitted = 0;
    for (const auto& [name, v] : k) {
        if (name.rfind("catalog:", 0) == 0) continue;
        ++fitted;
        EXPECT_NEAR(v / k.at("catalog:" + name), 1.0, 0.02) << name << " fits " << v;
    }
    EXPECT_GE(fitted, 12);
}

TEST(PlanValidation, ErrorsStayWhereRecorded) {
    const ValidationReport r = validate(runs(), test::schema());
    const auto& tput = r.stats.at("throughput");
    const auto& iter = r.stats.at("iteration time");
    const auto& mem = r.stats.at("memory");
    EXPECT_LE(tput.at("fit").median, 0.08);
    EXPECT_LE(iter.at("fit").median, 0.08);
    EXPECT_LE(mem.at("fit").median, 0.10);
    // Held out (BENCHMARKS.md): every metric meets the targets (median 8% /
    // 10% / 8%, p90 20% / 10% / 20%); throughput's p90 (17.6%) is set by the
    // misses docs/planner.md lists (fine-grained experts on H100, expert
    // parallelism across nodes, early fp8 in llm-foundry, DeepSeek's
    // pipelines, exposed all-gather context parallelism at 131k).
    EXPECT_LE(iter.at("holdout").median, 0.08);
    EXPECT_LE(iter.at("holdout").p90, 0.20);
    EXPECT_LE(mem.at("holdout").median, 0.10);
    EXPECT_LE(mem.at("holdout").p90, 0.10);
    EXPECT_LE(tput.at("holdout").median, 0.08);
    EXPECT_LE(tput.at("holdout").p90, 0.20);
}

TEST(PlanValidation, MalformedRunsAreErrorsNamingTheField) {
    const std::string path = testing::TempDir() + "/bad_validation.toml";
    std::ofstream(path) << "[[run]]\nname = \"x\"\nsource = \"somewhere\"\nsplit = \"fit\"\n"
                           "set = []\ntflops = 3\n";
    try {
        read_validation(path);
        FAIL();
    } catch (const ConfigError& e) {
        EXPECT_NE(std::string(e.what()).find("unknown field 'tflops'"), std::string::npos)
            << e.what();
    }
    std::ofstream(path) << "[[run]]\nname = \"x\"\nsource = \"somewhere\"\nsplit = \"train\"\n";
    EXPECT_THROW(read_validation(path), ConfigError);
}

}  // namespace
}  // namespace apiary::plan
