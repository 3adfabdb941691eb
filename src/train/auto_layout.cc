#include "train/auto_layout.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"
#include "core/parallelism.h"
#include "plan/planner.h"
#include "plan/search.h"
#include "train/options.h"

namespace apiary::train {

namespace {

constexpr double kGiB = 1024.0 * 1024 * 1024;

std::string describe(const plan::Plan& p) {
    return fmt::format("{} ({:.3g} s per step, {:.2f} GiB per rank)", plan::layout_string(p.l),
                       p.st.total, p.mem.total() / kGiB);
}

}  // namespace

core::Config with_layout(const core::Config& c, const plan::Layout& l, long long global_batch) {
    core::Config out = c;
    const auto set = [&](const std::string& key, const std::string& value) {
        out.set(key + "=" + value);
    };
    set("parallel.tp", std::to_string(l.tp));
    set("parallel.pp", std::to_string(l.pp));
    set("parallel.dp", std::to_string(l.dp));
    set("parallel.ep", std::to_string(l.ep));
    set("parallel.zero_stage", std::to_string(l.zero));
    set("parallel.recompute", core::recompute_name(l.recompute));
    set("parallel.sequence_parallel", l.sp ? "true" : "false");
    set("parallel.schedule", core::pipeline_schedule_name(l.schedule));
    if (l.schedule == core::PipelineSchedule::interleaved) {
        set("parallel.virtual_stages", std::to_string(l.vpp));
    }
    set("parallel.microbatches", "0");
    set("parallel.stage_layers", "");
    set("train.batch_size", std::to_string(l.micro_batch));
    set("train.grad_accum", std::to_string(l.n_micro));
    set("plan.global_batch", std::to_string(global_batch));
    return out;
}

LayoutChoice choose_layout(const core::Config& c, int world_size, int ranks_per_node) {
    LayoutChoice out{c, "", false};
    if (c.get_string("parallel.layout") != "auto") return out;
    if (world_size < 1 || ranks_per_node < 1) {
        throw ConfigError(fmt::format(
            "parallel.layout = auto: {} ranks with {} per host is not a world to lay out",
            world_size, ranks_per_node));
    }

    // The global batch the user asked for: pinned, or the given layout's.
    long long global_batch = c.get_int("plan.global_batch");
    if (global_batch == 0) {
        const long long model_par = c.get_int("parallel.tp") * c.get_int("parallel.pp");
        long long dp = c.get_int("parallel.dp");
        if (dp == 0) dp = std::max<long long>(1, world_size / model_par);
        global_batch = c.get_int("train.batch_size") * c.get_int("train.grad_accum") * dp;
    }

    // The planner's view of this launch: every rank a device of the
    // configured kind (this machine's by default), ranks_per_node per host.
    core::Config p = c;
    p.set(fmt::format("cluster.gpus={}", world_size));
    if (c.get_int("cluster.gpus_per_node") == 0) {
        p.set(fmt::format("cluster.gpus_per_node={}", ranks_per_node));
    }
    p.set(fmt::format("plan.global_batch={}", global_batch));
    for (const char* k : {"parallel.tp=1", "parallel.pp=1", "parallel.dp=0", "parallel.cp=1",
                          "parallel.ep=1", "parallel.stage_layers=", "parallel.microbatches=0"}) {
        p.set(k);
    }
    const plan::PlanInput in = plan::search_input(p);
    plan::SearchOptions opt;
    opt.top = 1 << 20;  // every fitting layout, ranked: the trainer may refuse some
    const plan::SearchResult r = plan::search(in.w, in.c, opt);
    if (r.best.empty()) {
        throw ConfigError("parallel.layout = auto: " + plan::fits_nowhere(in.w, in.c, r));
    }

    std::vector<const plan::Plan*> accepted;
    long long refused = 0;
    std::string first_refusal;
    for (const plan::Plan& cand : r.best) {
        // The axis the planner models and the trainer does not train.
        if (cand.l.cp != 1) continue;
        try {
            validate_config(with_layout(c, cand.l, global_batch), world_size);
        } catch (const ConfigError& e) {
            if (first_refusal.empty()) {
                first_refusal = fmt::format("{}: {}", plan::layout_string(cand.l), e.what());
            }
            ++refused;
            continue;
        }
        accepted.push_back(&cand);
        if (accepted.size() == 3) break;
    }
    if (accepted.empty()) {
        throw ConfigError(fmt::format(
            "parallel.layout = auto: none of the {} layouts that fit {} ranks is one the trainer "
            "accepts (the first refused: {}); set the parallel.* keys and parallel.layout = "
            "manual",
            r.best.size(), world_size, first_refusal));
    }

    const plan::Plan& best = *accepted.front();
    out.config = with_layout(c, best.l, global_batch);
    out.chosen = true;
    const std::string& cal = c.get_string("plan.calibration");
    out.report = fmt::format(
        "parallel.layout = auto: {} ranks, {} per host, global batch {} x {} tokens, priced "
        "with {}; chose {}",
        world_size, std::min(world_size, int(in.c.ranks_per_node())), global_batch, in.w.seq_len,
        cal.empty() ? fmt::format("the catalog's {} (no plan.calibration: run `apiary plan "
                                  "calibrate` on a few runs of this machine to fit it)",
                                  in.c.dev.name)
                    : fmt::format("the calibration {}", cal),
        describe(best));
    for (size_t i = 1; i < accepted.size(); ++i) {
        out.report += fmt::format("; then {} (+{:.0f}%)", describe(*accepted[i]),
                                  100 * (accepted[i]->st.total / best.st.total - 1));
    }
    out.report += fmt::format("; {} layouts considered, {} fit in memory", r.candidates, r.fitting);
    if (refused > 0) {
        out.report += fmt::format(", {} faster ones refused by the trainer (e.g. {})", refused,
                                  first_refusal);
    }
    return out;
}

}  // namespace apiary::train
