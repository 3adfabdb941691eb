// parallel.layout = auto: the planner's fastest layout that the trainer
// accepts, with the global batch kept.

#include "train/auto_layout.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "plan/planner.h"
#include "plan/search.h"
#include "train/keys.h"
#include "train/options.h"

namespace apiary::train {
namespace {

const core::Schema& schema() {
    static const core::Schema s = [] {
        core::Schema x;
        core::add_shared_keys(x);
        add_keys(x);
        plan::add_keys(x);
        return x;
    }();
    return s;
}

core::Config config(const std::vector<std::string>& extra) {
    core::Config c(schema());
    for (const char* kv : {"model.preset=tiny", "model.n_layer=8", "model.n_embd=256",
                           "model.n_head=8", "model.vocab_size=2048", "train.seq_len=128",
                           "train.batch_size=4", "parallel.layout=auto"}) {
        c.set(kv);
    }
    for (const auto& kv : extra) c.set(kv);
    return c;
}

long long global_batch(const core::Config& c) {
    return c.get_int("train.batch_size") * c.get_int("train.grad_accum") * c.get_int("parallel.dp");
}

TEST(AutoLayout, ManualLeavesTheConfigAlone) {
    const core::Config c = config({"parallel.layout=manual", "parallel.tp=2"});
    const LayoutChoice ch = choose_layout(c, 4, 4);
    EXPECT_FALSE(ch.chosen);
    EXPECT_EQ(ch.config.hash(), c.hash());
    EXPECT_TRUE(ch.report.empty());
}

TEST(AutoLayout, ChoosesTheFastestAcceptedLayoutAndKeepsTheGlobalBatch) {
    for (int world : {1, 2, 4, 8}) {
        for (int per_host : {1, 2, world}) {
            if (per_host > world || world % per_host != 0) continue;
            const core::Config c = config({});
            const LayoutChoice ch = choose_layout(c, world, per_host);
            ASSERT_TRUE(ch.chosen);
            const core::Config& out = ch.config;
            // 4 sequences per rank on the pure data-parallel layout as given.
            EXPECT_EQ(global_batch(out), 4LL * world) << ch.report;
            EXPECT_EQ(out.get_int("plan.global_batch"), 4LL * world);
            EXPECT_EQ(out.get_int("parallel.tp") * out.get_int("parallel.pp") *
                          out.get_int("parallel.dp"),
                      world);
            EXPECT_NO_THROW(validate_config(out, world)) << ch.report;
            EXPECT_NE(ch.report.find("chose"), std::string::npos);
            EXPECT_NE(ch.report.find(std::to_string(world) + " ranks"), std::string::npos)
                << ch.report;

            // Nothing the planner ranks faster is one the trainer accepts.
            core::Config p = c;
            p.set("cluster.gpus=" + std::to_string(world));
            p.set("cluster.gpus_per_node=" + std::to_string(per_host));
            p.set("plan.global_batch=" + std::to_string(4 * world));
            const plan::PlanInput in = plan::search_input(p);
            plan::SearchOptions opt;
            opt.top = 1 << 20;
            const plan::SearchResult r = plan::search(in.w, in.c, opt);
            core::Config priced = out;
            priced.set("cluster.gpus=" + std::to_string(world));
            priced.set("cluster.gpus_per_node=" + std::to_string(per_host));
            const plan::PlanInput chosen = plan::plan_input(priced);
            const double t = plan::evaluate(chosen.w, chosen.l, chosen.c).st.total;
            for (const plan::Plan& q : r.best) {
                if (q.st.total >= t * (1 - 1e-12)) break;
                if (q.l.cp != 1) continue;
                EXPECT_THROW(validate_config(with_layout(c, q.l, 4 * world), world), ConfigError)
                    << plan::layout_string(q.l) << " is faster and was passed over";
            }
            // The same inputs, the same choice (every rank computes it).
            EXPECT_EQ(choose_layout(c, world, per_host).config.hash(), out.hash());
        }
    }
}

TEST(AutoLayout, PinnedGlobalBatchAndResumeChooseTheSame) {
    const LayoutChoice first = choose_layout(config({"train.grad_accum=3"}), 4, 2);
    EXPECT_EQ(global_batch(first.config), 4 * 3 * 4);
    // A resume reads the chosen keys back from config.toml: the same choice.
    const LayoutChoice again = choose_layout(first.config, 4, 2);
    EXPECT_EQ(again.config.hash(), first.config.hash());
    // On fewer ranks (an elastic restart) the global batch stays.
    const LayoutChoice fewer = choose_layout(first.config, 2, 2);
    EXPECT_EQ(global_batch(fewer.config), 4 * 3 * 4) << fewer.report;
}

TEST(AutoLayout, AModelThatFitsNowhereIsRefusedWithWhatItNeeds) {
    try {
        choose_layout(config({"cluster.mem_gib=0.001"}), 2, 2);
        FAIL() << "a 1 MiB device was accepted";
    } catch (const ConfigError& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find("parallel.layout = auto"), std::string::npos) << what;
        EXPECT_NE(what.find("GiB"), std::string::npos) << what;
    }
}

}  // namespace
}  // namespace apiary::train
