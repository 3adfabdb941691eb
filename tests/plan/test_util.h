#pragma once
// Shared helpers for the planner tests: a resolved schema and config
// without the CLI (which plan/ cannot link), and published-run shapes.

#include <string>
#include <vector>

#include "core/config.h"
#include "core/model_spec.h"
#include "plan/planner.h"

namespace apiary::plan::test {

inline const core::Schema& schema() {
    static const core::Schema s = [] {
        core::Schema x;
        core::add_shared_keys(x);
        add_keys(x);
        return x;
    }();
    return s;
}

inline PlanInput input(const std::vector<std::string>& sets) {
    core::Config c(schema());
    for (const auto& s : sets) c.set(s);
    return plan_input(c);
}

// Device count, model and batch only: what `plan search` starts from.
inline PlanInput search_in(const std::vector<std::string>& sets) {
    core::Config c(schema());
    for (const auto& s : sets) c.set(s);
    return search_input(c);
}

inline Plan plan_of(const std::vector<std::string>& sets) {
    const PlanInput in = input(sets);
    return evaluate(in.w, in.l, in.c);
}

// A GPT model of the Megatron papers: vocabulary 51,200, sequence 2,048.
inline std::vector<std::string> megatron_gpt(int layers, int hidden, int heads) {
    return {"model.preset=gpt3-175b",
            "model.n_layer=" + std::to_string(layers),
            "model.n_embd=" + std::to_string(hidden),
            "model.n_head=" + std::to_string(heads),
            "model.vocab_size=51200",
            "train.seq_len=2048",
            "plan.attention=materialized"};
}

inline std::vector<std::string> operator+(std::vector<std::string> a,
                                          const std::vector<std::string>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
}

}  // namespace apiary::plan::test
