// Where the data-parallel gradient reductions start: the engine on ranks as
// threads, one step each. The counter the trainer writes
// (dp_reductions_in_backward) counts a reduction only when it started while
// the model's backward ran, so deferring every reduction until after
// backward shows in it, and so does the tied embedding of a pipeline, whose
// reduction waits for the sum over both ends after backward.

#include <gtest/gtest.h>

#include <mutex>
#include <string>
#include <vector>

#include "comm/thread_backend.h"
#include "core/config.h"
#include "core/threads.h"
#include "parallel/engine.h"
#include "parallel/layout.h"
#include "train/keys.h"

using namespace apiary;

namespace {

struct Counts {
    int reductions = 0, in_backward = 0;
};

constexpr int64_t kB = 2, kT = 16;

core::Config config(const std::vector<std::string>& sets) {
    static const core::Schema s = [] {
        core::Schema schema;
        core::add_shared_keys(schema);
        train::add_keys(schema);
        return schema;
    }();
    core::Config c(s);
    for (const char* kv :
         {"model.preset=tiny", "model.n_layer=2", "model.n_embd=32", "model.n_head=2",
          "train.grad_accum=2", "train.batch_size=2", "train.seq_len=16"}) {
        c.set(kv);
    }
    for (const auto& kv : sets) c.set(kv);
    return c;
}

// One step on `world` thread ranks; the counts of the world rank 0.
Counts step_counts(int world, const std::vector<std::string>& sets, bool overlap) {
    const core::Config c = config(sets);
    const core::ModelSpec spec = core::model_spec_from(c);
    const parallel::ParallelLayout layout = parallel::parallel_layout_from(c, spec, world);
    parallel::EngineOptions o;
    o.bucket_mb = 0.01;  // several buckets of the small model
    o.overlap_reduction = overlap;
    Counts out;
    std::mutex mu;
    core::set_num_threads(1);
    comm::run_threads(world, [&](comm::ProcessGroup& g) {
        parallel::Engine e(spec, layout, &g, kB, kT, o);
        e.init(1);
        const int64_t rows = kB * layout.microbatches;
        std::vector<int32_t> tokens(size_t(rows * (kT + 1)));
        for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t((i * 7 + 3) % 256);
        e.train_step(tokens.data(), rows, kT, 1e-3, false);
        if (g.rank() == 0) {
            std::lock_guard<std::mutex> lock(mu);
            out = {e.dp_reductions(), e.dp_reductions_in_backward()};
        }
    });
    return out;
}

}  // namespace

TEST(Overlap, ReductionsStartInsideBackwardUnlessDeferred) {
    for (int zero : {0, 1}) {
        SCOPED_TRACE(zero);
        const std::vector<std::string> sets = {"parallel.zero_stage=" + std::to_string(zero)};
        const Counts overlapped = step_counts(2, sets, true);
        EXPECT_GE(overlapped.reductions, 4);
        // The embedding is complete last, still inside backward: all of them.
        EXPECT_EQ(overlapped.in_backward, overlapped.reductions);
        const Counts deferred = step_counts(2, sets, false);
        EXPECT_EQ(deferred.reductions, overlapped.reductions);
        EXPECT_EQ(deferred.in_backward, 0);
    }
}

TEST(Overlap, ShardedGradientsReduceAsBackwardReleasesThem) {
    // Stage 2 reduces each lent unit on every micro-step as backward
    // releases it: two micro-steps, four units (embedding, two blocks, final).
    const Counts c = step_counts(2, {"parallel.zero_stage=2"}, true);
    EXPECT_EQ(c.reductions, 2 * 4);
    EXPECT_EQ(c.in_backward, c.reductions);
}

TEST(Overlap, TiedEmbeddingOfAPipelineReducesAfterBackward) {
    // pp 2 x dp 2: the first stage's embedding is summed with the last
    // stage's tied copy after backward; only then does its reduction start.
    const Counts c = step_counts(4, {"parallel.pp=2", "parallel.dp=2"}, true);
    EXPECT_GE(c.reductions, 2);
    EXPECT_GE(c.in_backward, 1);
    EXPECT_LT(c.in_backward, c.reductions);
}
