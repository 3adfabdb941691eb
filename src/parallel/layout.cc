#include "parallel/layout.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "core/stage_split.h"
#include "parallel/zero.h"

namespace apiary::parallel {

namespace {

std::string join(const std::vector<int>& v, const char* sep) {
    std::string s;
    for (size_t i = 0; i < v.size(); ++i) s += fmt::format("{}{}", i ? sep : "", v[i]);
    return s;
}

// Divisors of n up to `limit`, for messages that say what would work.
std::string divisors(int64_t n, int64_t limit = 64) {
    std::string s;
    for (int64_t d = 1; d <= std::min(n, limit); ++d) {
        if (n % d == 0) s += fmt::format("{}{}", s.empty() ? "" : ", ", d);
    }
    return s;
}

// Every refusal names the key, the value and what would work.
void check_expert_parallel(const ParallelLayout& l, const core::ModelSpec& spec) {
    const int ep = l.ep, dp = l.mesh.dp;
    if (ep == 1) return;
    if (!spec.moe()) {
        throw ConfigError(fmt::format(
            "parallel.ep = {} needs a mixture-of-experts model (model.n_expert > 0); this model "
            "is dense: set parallel.ep = 1",
            ep));
    }
    if (spec.n_expert % ep != 0) {
        throw ConfigError(fmt::format(
            "parallel.ep = {} does not divide model.n_expert = {}: every expert-parallel rank "
            "holds the same number of experts; ep can be {} (within the data-parallel ranks)",
            ep, spec.n_expert, divisors(std::gcd(spec.n_expert, dp))));
    }
    if (dp % ep != 0) {
        throw ConfigError(fmt::format(
            "parallel.ep = {} does not divide the {} data-parallel ranks (parallel.dp): the "
            "expert-parallel groups are carved out of them; ep can be {}",
            ep, dp, divisors(std::gcd(spec.n_expert, dp))));
    }
    if (l.mesh.tp > 1) {
        throw ConfigError(fmt::format(
            "parallel.ep = {} with parallel.tp = {}: expert parallelism runs with data and "
            "pipeline parallelism (not yet with tensor parallelism); set parallel.tp = 1",
            ep, l.mesh.tp));
    }
    if (l.zero_stage >= 3) {
        throw ConfigError(fmt::format(
            "parallel.zero_stage = {} with parallel.ep = {}: expert parallelism runs with ZeRO "
            "stages 0-2 (the experts' gradients and optimizer state sharded over dp / ep ranks); "
            "use parallel.zero_stage = 2",
            l.zero_stage, ep));
    }
}

}  // namespace

ParallelLayout parallel_layout_from(const core::Config& c, const core::ModelSpec& spec,
                                    int world_size) {
    ParallelLayout out;
    out.mesh = comm::mesh_shape_from(c, world_size);
    const int tp = out.mesh.tp, pp = out.mesh.pp;
    out.zero_stage = int(c.get_int("parallel.zero_stage"));
    check_zero_stage(out.zero_stage);
    out.recompute = core::parse_recompute(c.get_string("parallel.recompute"));
    out.schedule = core::parse_pipeline_schedule(c.get_string("parallel.schedule"));
    out.sequence_parallel = c.get_bool("parallel.sequence_parallel");
    const int64_t B = c.get_int("train.batch_size"), T = c.get_int("train.seq_len");
    const int accum = int(c.get_int("train.grad_accum"));
    const int mb = int(c.get_int("parallel.microbatches"));
    if (mb > 0 && mb != accum) {
        throw ConfigError(
            fmt::format("parallel.microbatches = {} but train.grad_accum = {}: the "
                        "pipeline's micro-batches are the step's micro-steps; set "
                        "train.grad_accum = {} (or parallel.microbatches = 0)",
                        mb, accum, mb));
    }
    out.microbatches = accum;

    // Tensor parallelism: whole heads, KV groups and MLP slices per rank.
    model::local_dims(spec, tp, 0);
    if (out.sequence_parallel && tp == 1) {
        throw ConfigError(
            "parallel.sequence_parallel = true needs tensor parallelism "
            "(parallel.tp > 1): it splits the norms' rows across the tp ranks");
    }
    if (out.sequence_parallel) {
        const int64_t start = c.get_int("data.curriculum_start");
        for (int64_t t : {T, start}) {
            if (t <= 0) continue;
            const int64_t rows = B * t;  // curriculum 'tokens' mode keeps B*T
            if (rows % tp != 0) {
                throw ConfigError(fmt::format(
                    "parallel.sequence_parallel: a micro-batch of {} x {} = {} rows does not "
                    "split over parallel.tp = {}; make train.batch_size x train.seq_len a "
                    "multiple of {}",
                    B, t, rows, tp, tp));
            }
        }
    }

    // Expert parallelism, carved out of the data-parallel ranks.
    out.ep = int(c.get_int("parallel.ep"));
    check_expert_parallel(out, spec);

    // Pipeline parallelism.
    if (out.schedule == PipelineSchedule::interleaved) {
        if (pp == 1) {
            throw ConfigError(
                "parallel.schedule = 'interleaved' needs parallel.pp > 1 (there is "
                "no pipeline to interleave); use 1f1b");
        }
        out.virtual_stages = int(c.get_int("parallel.virtual_stages"));
        if (accum % pp != 0) {
            throw ConfigError(fmt::format(
                "parallel.schedule = 'interleaved' needs the micro-batches (train.grad_accum = {}) "
                "to be a multiple of parallel.pp = {} (Megatron-LM's rule); e.g. {}",
                accum, pp, ((accum + pp - 1) / pp) * pp));
        }
    }
    if (pp > 1 && out.schedule == PipelineSchedule::one_f_one_b && accum < pp) {
        throw ConfigError(fmt::format(
            "parallel.schedule = '1f1b' with {} micro-batches (train.grad_accum) and "
            "parallel.pp = {} stages: 1F1B needs at least as many micro-batches as stages; set "
            "train.grad_accum >= {} (4 x {} keeps the bubble near 20%)",
            accum, pp, pp, pp));
    }
    if (pp > 1 && out.zero_stage >= 2) {
        throw ConfigError(fmt::format(
            "parallel.zero_stage = {} with parallel.pp = {}: ZeRO-2 and -3 reduce (and gather) "
            "every micro-batch, which the pipeline's interleaved micro-batches do not allow "
            "here; use parallel.zero_stage = 1 with pipeline parallelism",
            out.zero_stage, pp));
    }
    const int parts = pp * out.virtual_stages;
    const int L = spec.n_layer;
    std::vector<int> counts;
    if (const std::string& list = c.get_string("parallel.stage_layers"); !list.empty()) {
        counts = core::parse_stage_layers(list, spec, parts, out.virtual_stages > 1);
    } else if (out.virtual_stages > 1) {
        if (L % parts != 0) {
            throw ConfigError(fmt::format(
                "parallel.schedule = 'interleaved' with parallel.pp = {} x "
                "parallel.virtual_stages = {} = {} virtual stages does not divide model.n_layer "
                "= {}; pick virtual_stages among the divisors of {} / pp, or list the blocks "
                "with parallel.stage_layers",
                pp, out.virtual_stages, parts, L, L));
        }
        counts.assign(size_t(parts), L / parts);
    } else {
        if (L < parts) {
            throw ConfigError(
                fmt::format("parallel.pp = {} stages for model.n_layer = {} blocks: "
                            "every stage needs at least one block (pp can be {})",
                            pp, L, divisors(L, L)));
        }
        counts = core::balanced_stage_layers(spec, parts, int(T));
    }
    int next = 0;
    for (int count : counts) {
        out.stage_blocks.emplace_back();
        for (int i = 0; i < count; ++i) out.stage_blocks.back().push_back(next++);
    }
    return out;
}

ParallelLayout one_rank_layout(const core::ModelSpec& spec, int microbatches) {
    ParallelLayout l;
    l.microbatches = microbatches;
    l.stage_blocks.emplace_back();
    for (int b = 0; b < spec.n_layer; ++b) l.stage_blocks[0].push_back(b);
    return l;
}

std::string ParallelLayout::describe() const {
    std::vector<int> counts;
    for (const auto& s : stage_blocks) counts.push_back(int(s.size()));
    std::string pipe;
    if (mesh.pp > 1) {
        pipe = fmt::format(", {}{}, {} micro-batches, blocks per stage {}",
                           core::pipeline_schedule_name(schedule),
                           virtual_stages > 1 ? fmt::format(" x{}", virtual_stages) : "",
                           microbatches, join(counts, "+"));
    }
    return fmt::format("dp {}{} x tp {} x pp {}{}{}{}{}", mesh.dp,
                       ep > 1 ? fmt::format(" (ep {})", ep) : "", mesh.tp, mesh.pp,
                       zero_stage ? fmt::format(", zero {}", zero_stage) : "",
                       sequence_parallel ? ", sequence parallel" : "",
                       recompute != core::Recompute::none
                           ? fmt::format(", recompute {}", core::recompute_name(recompute))
                           : "",
                       pipe);
}

model::ModelShard ParallelLayout::shard(const comm::MeshCoord& coord) const {
    model::ModelShard s;
    s.tp_size = mesh.tp;
    s.tp_rank = coord.tp;
    s.sequence_parallel = sequence_parallel && mesh.tp > 1;
    s.recompute = recompute;
    s.ep_size = ep;
    s.ep_rank = coord.dp % ep;
    const int p = mesh.pp;
    for (int chunk = 0; chunk < virtual_stages; ++chunk) {
        s.chunks.push_back(stage_blocks[size_t(chunk * p + coord.pp)]);
    }
    s.embedding = coord.pp == 0;
    s.head = coord.pp == p - 1;
    return s;
}

}  // namespace apiary::parallel
