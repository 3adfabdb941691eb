#include "train/options.h"

#include <fmt/format.h>

#include <sstream>

#include "core/error.h"
#include "core/model_spec.h"
#include "device/device.h"
#include "parallel/layout.h"

namespace apiary::train {

namespace {

std::set<int64_t> parse_step_list(const std::string& text, const char* key) {
    std::set<int64_t> out;
    std::stringstream ss(text);
    std::string item;
    while (std::getline(ss, item, ',')) {
        if (item.empty()) continue;
        try {
            size_t used = 0;
            const int64_t v = std::stoll(item, &used);
            if (used != item.size() || v < 1) throw std::invalid_argument(item);
            out.insert(v);
        } catch (const std::exception&) {
            throw ConfigError(
                fmt::format("{} = '{}': '{}' is not a step number (1, 2, ...)", key, text, item));
        }
    }
    return out;
}

std::vector<std::string> parse_prefixes(const std::string& text) {
    std::vector<std::string> out;
    std::stringstream ss(text);
    for (std::string prefix; std::getline(ss, prefix, ',');) {
        if (!prefix.empty()) out.push_back(prefix);
    }
    return out;
}

parallel::EngineOptions engine_options(const core::Config& c) {
    parallel::EngineOptions o;
    o.precision = model::parse_precision(c.get_string("train.precision"));
    o.adamw = {float(c.get_real("train.beta1")), float(c.get_real("train.beta2")),
               float(c.get_real("train.eps")), float(c.get_real("train.weight_decay")),
               float(c.get_real("train.grad_clip"))};
    o.loss_scaler = {c.get_real("train.loss_scale_init"), 2.0, 0.5,
                     c.get_int("train.loss_scale_growth_interval"),
                     c.get_real("train.loss_scale_min")};
    o.bucket_mb = c.get_real("comm.bucket_mb");
    o.bf16_wire = c.get_string("comm.grad_dtype") == "bf16";
    o.freeze = parse_prefixes(c.get_string("train.freeze"));
    return o;
}

SaveOptions save_options(const core::Config& c) {
    SaveOptions o;
    o.keep = c.get_int("train.ckpt_keep");
    o.async = c.get_bool("train.ckpt_async");
    o.incremental = c.get_bool("train.ckpt_incremental");
    o.piece_bytes =
        std::max<int64_t>(4, int64_t(c.get_real("train.ckpt_piece_mb") * 1048576.0) / 4 * 4);
    return o;
}

}  // namespace

TrainOptions TrainOptions::from_config(const core::Config& c) {
    TrainOptions o;
    o.run_dir = c.get_string("run.dir");
    o.batch_size = c.get_int("train.batch_size");
    o.seq_len = c.get_int("train.seq_len");
    o.grad_accum = c.get_int("train.grad_accum");
    o.steps = c.get_int("train.steps");
    o.seed = uint64_t(c.get_int("train.seed"));
    o.threads = c.get_int("train.threads");
    o.precision_name = c.get_string("train.precision");
    o.precision = model::parse_precision(o.precision_name);
    o.lr = c.get_real("train.lr");
    o.min_lr = c.get_real("train.min_lr");
    o.warmup_steps = c.get_int("train.warmup_steps");
    o.lr_by_tokens = c.get_string("train.lr_schedule_by") == "tokens";
    o.curriculum_start = c.get_int("data.curriculum_start");
    o.curriculum_steps = c.get_int("data.curriculum_steps");
    o.curriculum_mode = c.get_string("data.curriculum_mode");
    o.log_every = c.get_int("train.log_every");
    o.eval_every = c.get_int("train.eval_every");
    o.eval_batches = c.get_int("train.eval_batches");
    o.ckpt_every = c.get_int("train.ckpt_every");
    o.ckpt_mtbf_hours = c.get_real("train.ckpt_mtbf_hours");
    o.ckpt_every_auto = c.get_bool("train.ckpt_every_auto");
    o.save = save_options(c);
    o.rollback = c.get_bool("train.rollback");
    o.spike_zscore = c.get_real("train.spike_zscore");
    o.spike_window = c.get_int("train.spike_window");
    o.max_rollbacks = c.get_int("train.max_rollbacks");
    o.elastic = c.get_bool("train.elastic");
    o.engine = engine_options(c);
    o.inject_overflow_steps =
        parse_step_list(c.get_string("debug.inject_overflow_steps"), "debug.inject_overflow_steps");
    return o;
}

namespace {

// A prefix that names no parameter is a typo that would silently train
// everything: checked against the whole model's names (the registry alone).
void check_freeze(const std::vector<std::string>& prefixes, const core::ModelSpec& spec) {
    if (prefixes.empty()) return;
    model::ModelOptions o;
    o.storage = model::Storage::sharded;
    const model::Transformer m(spec, 1, 1, o);
    for (const auto& prefix : prefixes) {
        bool any = false;
        for (const auto& e : m.registry().entries()) any |= e.name.rfind(prefix, 0) == 0;
        if (!any) {
            throw ConfigError(fmt::format(
                "train.freeze: '{}' is the prefix of no parameter of this model (its "
                "parameters are named like '{}' and '{}'; `apiary ckpt inspect` lists them)",
                prefix, m.registry().entries().front().name, m.registry().entries()[1].name));
        }
    }
}

// Mixture-of-experts blocks run data-, expert- and pipeline-parallel in fp32 or bf16.
void check_moe_layout(const core::Config& c, const core::ModelSpec& spec) {
    if (!spec.moe()) return;
    if (c.get_int("parallel.tp") != 1) {
        throw ConfigError(fmt::format(
            "parallel.tp = {} with model.n_expert = {}: mixture-of-experts blocks train with "
            "data, expert and pipeline parallelism and ZeRO 1-3 (not yet tensor parallel); set "
            "parallel.tp = 1",
            c.get_int("parallel.tp"), spec.n_expert));
    }
    if (const std::string p = c.get_string("train.precision"); p == "fp16") {
        throw ConfigError(fmt::format(
            "train.precision = '{}' with model.n_expert = {}: mixture-of-experts blocks train in "
            "fp32 or bf16 (not fp16)",
            p, spec.n_expert));
    }
}

// train.device = cuda: the build and the machine first (what is missing, by
// name), then the part not built yet. Runs before any run directory exists.
void check_device(const core::Config& c) {
    const auto kind = device::parse_device(c.get_string("train.device"), "train.device");
    device::require_device(kind, "train.device");
    if (kind == device::DeviceKind::cuda) {
        throw ConfigError(
            "train.device = 'cuda': this build has the CUDA kernels, cuBLASLt GEMMs and the NCCL "
            "process group (scripts/device-check.sh checks them on a GPU), but the trainer's step "
            "does not run on the GPU yet (docs/gpu.md); set train.device = 'cpu'");
    }
}

}  // namespace

// The layout is checked against the model (parallel_layout_from) once the
// vocabulary is known.
void validate_config(const core::Config& c, int world_size) {
    check_device(c);
    // Keys the planner models but the trainer cannot train (yet). Expert
    // parallelism (parallel.ep) is checked with the layout.
    if (c.get_int("parallel.cp") != 1) {
        throw ConfigError(
            fmt::format("parallel.cp = {}: context parallelism is modelled by `apiary plan` only; "
                        "the trainer needs it to be 1",
                        c.get_int("parallel.cp")));
    }
    if (c.get_string("train.precision") == "fp8") {
        throw ConfigError(
            "train.precision = 'fp8' is modelled by `apiary plan` only; the trainer "
            "trains in fp32, bf16 or fp16");
    }
    const TrainOptions o = TrainOptions::from_config(c);
    const core::ModelSpec spec = core::model_spec_from(c);
    check_moe_layout(c, spec);
    if (const std::string what = spec.trainer_unsupported(); !what.empty()) {
        throw ConfigError(
            fmt::format("{}: `apiary plan` models it, the trainer does not train it; "
                        "leave it unset for apiary train",
                        what));
    }
    spec.validate();
    const parallel::ParallelLayout layout = parallel::parallel_layout_from(c, spec, world_size);
    check_freeze(o.engine.freeze, spec);
    if (layout.zero_stage == 3 && o.precision == model::Precision::fp16) {
        throw ConfigError(
            "parallel.zero_stage = 3 with train.precision = 'fp16': sharded parameters take fp32 "
            "or bf16 (the emulated fp16 weight copy is made for the whole model at once); use "
            "stage 2 or bf16");
    }
    if (o.curriculum_start > 0 && o.curriculum_steps == 0) {
        throw ConfigError(
            fmt::format("data.curriculum_start = {} needs data.curriculum_steps > 0 "
                        "(the steps over which it grows to train.seq_len)",
                        o.curriculum_start));
    }
    if (o.min_lr > o.lr) {
        throw ConfigError(fmt::format("train.min_lr = {} exceeds train.lr = {}", o.min_lr, o.lr));
    }
}

}  // namespace apiary::train
