#include "parallel/engine.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "core/profile.h"
#include "core/timing.h"
#include "core/trace.h"
#include "comm/self_group.h"

namespace apiary::parallel {

using core::Clock;
using core::DType;
using core::MemCategory;
using core::seconds_since;

namespace {

// Point-to-point tags: one stream per receiving chunk and direction, so
// that messages between the same two ranks never cross (process_group.h).
int activation_tag(int chunk) { return 2 * chunk; }
int gradient_tag(int chunk) { return 2 * chunk + 1; }

}  // namespace

Engine::Engine(const core::ModelSpec& spec, const ParallelLayout& layout, comm::ProcessGroup* world,
               int64_t max_B, int64_t max_T, const EngineOptions& o)
    : spec_(spec),
      layout_(layout),
      self_(world && world->size() > 1 ? nullptr : std::make_shared<comm::SelfGroup>("world")),
      world_(self_ ? self_.get() : world),
      scaler_(o.loss_scaler, o.precision == model::Precision::fp16),
      overlap_reduction_(o.overlap_reduction) {
    APIARY_CHECK(layout_.mesh.world_size() == world_size(), "layout {} on {} ranks",
                 layout_.describe(), world_size());
    mesh_ = std::make_unique<comm::DeviceMesh>(
        std::shared_ptr<comm::ProcessGroup>(world_, [](comm::ProcessGroup*) {}), layout_.mesh);
    coord_ = mesh_->coord();
    const int p = layout_.pp(), dp = layout_.dp();
    // Without data-parallel peers there is nothing to shard.
    if (dp == 1) layout_.zero_stage = 0;
    if (p > 1 && spec_.tie_embeddings) {
        // The first and the last stage of each (dp, tp) pair share the tied
        // embedding: they sum its gradients.
        const bool end = coord_.pp == 0 || coord_.pp == p - 1;
        tied_group_ =
            world_->split(end ? coord_.dp * layout_.tp() + coord_.tp : -1, coord_.pp, "tied");
        has_tied_ = end;
    }
    tp_ = std::make_unique<TpComm>(mesh_->tp());
    const int ep = layout_.ep;
    if (ep > 1) {
        // ep consecutive dp ranks exchange tokens; every ep-th holds the
        // same experts.
        ep_group_ = mesh_->dp().split(coord_.dp / ep, coord_.dp % ep, "ep");
        edp_group_ = mesh_->dp().split(coord_.dp % ep, coord_.dp / ep, "edp");
    }
    ep_ = std::make_unique<EpComm>(ep_group_ ? *ep_group_ : mesh_->dp());
    const PipelineSchedule kind = p == 1 ? PipelineSchedule::one_f_one_b : layout_.schedule;
    ops_ = pipeline_schedule(kind, p, coord_.pp, layout_.microbatches, layout_.virtual_stages);

    model::ModelOptions mo;
    mo.precision = o.precision;
    mo.flat_multiple = shard_multiple(dp);
    mo.storage = storage_for(layout_.zero_stage);
    mo.shard = layout_.shard(coord_);
    mo.shard.slots = slots_needed(ops_);
    model_ = std::make_unique<model::Transformer>(spec_, max_B, max_T, mo);
    model_->set_tp_comm(tp_.get());
    model_->set_ep_comm(ep > 1 ? ep_.get() : nullptr);
    if (has_tied_) {
        tied_entry_ = model_->registry().index_of(
            spec_.arch == core::Arch::gpt2 ? "wte.weight" : "model.embed_tokens.weight");
        APIARY_CHECK(tied_entry_ >= 0, "stage {} has no tied embedding", coord_.pp);
    }
    max_rows_ = model_->rows(max_B, max_T);
    tokens_.resize(size_t(max_B * max_T));
    targets_.resize(size_t(max_B * max_T));
    if (p > 1) io_ = core::Tensor({max_rows_ * spec_.n_embd}, DType::f32, MemCategory::buffers);
    free_slots_.resize(size_t(model_->num_chunks()));
    slot_of_.resize(size_t(model_->num_chunks()));
    tp_fixed_.assign(model_->units().size(), false);

    DataParallelOptions d;
    d.zero_stage = layout_.zero_stage;
    d.bucket_mb = o.bucket_mb;
    d.bf16_wire = o.bf16_wire;
    d.adamw = o.adamw;
    d.freeze = o.freeze;
    d.tp_rank = coord_.tp;
    d.experts = {edp_group_.get(), ep};
    dp_ = std::make_unique<DataParallel>(mesh_->dp(), *model_, d,
                                         [this](int u, float* g) { reduce_tp_partial(u, g); });
}

Engine::~Engine() {
    try {
        reap_sends(true);
    } catch (...) {
    }
    if (model_) {
        model_->set_grad_ready_hook(nullptr);
        model_->set_tp_comm(nullptr);
        model_->set_ep_comm(nullptr);
    }
}

void Engine::init(uint64_t seed) { dp_->init(seed); }

// ---- point to point ----

void Engine::send(const float* data, int64_t n, int dst, int tag) {
    reap_sends(false);
    core::Tensor buf;
    if (!spare_.empty()) {
        buf = std::move(spare_.back());
        spare_.pop_back();
    } else {
        buf = core::Tensor({max_rows_ * spec_.n_embd}, DType::f32, MemCategory::buffers);
    }
    std::memcpy(buf.f32(), data, size_t(n) * sizeof(float));
    auto work = mesh_->pp().send(buf.f32(), n, DType::f32, dst, {"pp_send", tag});
    sends_.push_back({std::move(work), std::move(buf)});
    pp_bytes_ += 4.0 * double(n);
}

void Engine::recv(float* data, int64_t n, int src, int tag) {
    const auto t0 = Clock::now();
    APIARY_TRACE("pp recv", core::trace::Kind::wait, -1, int64_t(4 * n));
    mesh_->pp().recv(data, n, DType::f32, src, {"pp_recv", tag})->wait();
    times_.pp_wait += seconds_since(t0);
    pp_bytes_ += 4.0 * double(n);
}

void Engine::reap_sends(bool all) {
    while (!sends_.empty()) {
        Pending& front = sends_.front();
        if (all) {
            front.work->wait();
        } else if (!front.work->test()) {
            return;
        }
        spare_.push_back(std::move(front.buf));
        sends_.pop_front();
    }
}

// ---- the schedule ----

void Engine::unpack(const int32_t* rows, int micro, int64_t B, int64_t T) {
    for (int64_t i = 0; i < B; ++i) {
        const int32_t* row = rows + (int64_t(micro) * B + i) * (T + 1);
        std::copy_n(row, T, tokens_.data() + i * T);
        std::copy_n(row + 1, T, targets_.data() + i * T);
    }
}

bool Engine::loss_contributor() const { return coord_.pp == layout_.pp() - 1 && coord_.tp == 0; }

void Engine::forward_op(const PipeOp& op, const int32_t* rows, int64_t B, int64_t T) {
    const int p = layout_.pp(), s = coord_.pp, v = layout_.virtual_stages;
    const int j = op.chunk * p + s, last = p * v - 1;
    auto& free = free_slots_[size_t(op.chunk)];
    APIARY_CHECK(!free.empty(), "no activation slot left for chunk {}", op.chunk);
    const int slot = free.back();
    free.pop_back();
    slot_of_[size_t(op.chunk)][size_t(op.micro)] = slot;
    const int64_t n = model_->rows(B, T) * spec_.n_embd;
    if (j == 0) unpack(rows, op.micro, B, T);
    if (j > 0) recv(io_.f32(), n, (s - 1 + p) % p, activation_tag(op.chunk));
    const auto t0 = Clock::now();
    const double tp0 = tp_->seconds() + ep_->seconds();  // communication inside the op
    model_->forward(op.chunk, slot, tokens_.data(), j > 0 ? io_.f32() : nullptr, B, T);
    const double dt = seconds_since(t0);
    times_.compute += dt;
    times_.forward += dt - (tp_->seconds() + ep_->seconds() - tp0);
    times_.forward_op += dt;
    times_.forward_ops += 1;
    if (j < last) {
        send(model_->output(op.chunk, slot), n, (s + 1) % p,
             activation_tag(s == p - 1 ? op.chunk + 1 : op.chunk));
    }
}

void Engine::backward_op(const PipeOp& op, const int32_t* rows, int64_t B, int64_t T,
                         float grad_scale, model::LossResult& local) {
    const int p = layout_.pp(), s = coord_.pp, v = layout_.virtual_stages, m = layout_.microbatches;
    const int j = op.chunk * p + s, last = p * v - 1;
    const int slot = slot_of_[size_t(op.chunk)][size_t(op.micro)];
    const int64_t n = model_->rows(B, T) * spec_.n_embd;
    // The reductions start from inside the backward of each chunk's last
    // micro-batch.
    if (op.micro == m - 1 && overlap_reduction_) {
        model_->set_grad_ready_hook([this](int64_t from) { on_grads_ready(from); });
    }
    if (j < last) recv(io_.f32(), n, (s + 1) % p, gradient_tag(op.chunk));
    model_->set_loss_grad_scale(grad_scale);
    dp_->sync().set_in_backward(true);
    const auto t0 = Clock::now();
    const double tp0 = tp_->seconds() + ep_->seconds();  // communication inside the op
    if (j == last) {
        unpack(rows, op.micro, B, T);
        const model::LossResult r = model_->head_loss(op.chunk, slot, targets_.data(), &grad_scale);
        if (loss_contributor()) {
            local.loss_sum += r.loss_sum;
            local.count += r.count;
        }
    }
    model_->backward(op.chunk, slot, j < last ? io_.f32() : nullptr);
    dp_->sync().set_in_backward(false);
    const double dt = seconds_since(t0);
    times_.compute += dt;
    times_.backward += dt - (tp_->seconds() + ep_->seconds() - tp0);
    times_.backward_op += dt;
    times_.backward_ops += 1;
    model_->set_grad_ready_hook(nullptr);
    if (j > 0) {
        send(model_->input_grad(), n, (s - 1 + p) % p,
             gradient_tag(s == 0 ? op.chunk - 1 : op.chunk));
    }
    free_slots_[size_t(op.chunk)].push_back(slot);
}

void Engine::run_schedule(const int32_t* rows, int64_t B, int64_t T, float grad_scale, bool poison,
                          model::LossResult& local) {
    const int m = layout_.microbatches;
    for (size_t c = 0; c < free_slots_.size(); ++c) {
        free_slots_[c].clear();
        for (int i = model_->shard().slots - 1; i >= 0; --i) free_slots_[c].push_back(i);
        slot_of_[c].assign(size_t(m), -1);
    }
    for (const PipeOp& op : ops_) {
        if (op.forward) {
            forward_op(op, rows, B, T);
        } else {
            // Testing hook: an overflowing loss scale on one micro-step.
            const bool poisoned = poison && op.micro == m - 1;
            backward_op(op, rows, B, T,
                        poisoned ? std::numeric_limits<float>::infinity() : grad_scale, local);
        }
    }
    reap_sends(true);
    model_->end_pass();
}

// ---- gradients ----

void Engine::reduce_tp_partial(int unit, float* unit_grads) {
    if (layout_.tp() == 1 || !layout_.sequence_parallel) return;
    // Norm weights and positions under sequence parallelism: each rank's
    // gradient covers its rows only.
    const int64_t begin = model_->units()[size_t(unit)].begin;
    for (const auto& e : model_->registry().entries()) {
        if (!e.tp_partial_grad || e.offset < begin ||
            e.offset >= model_->units()[size_t(unit)].end) {
            continue;
        }
        tp_->all_reduce_sum(unit_grads + (e.offset - begin), e.numel());
    }
}

void Engine::on_grads_ready(int64_t final_from) {
    const auto& units = model_->units();
    if (model_->storage() == model::Storage::full) {
        for (int u = int(units.size()) - 1; u >= 0; --u) {
            if (units[size_t(u)].begin < final_from) break;
            if (tp_fixed_[size_t(u)]) continue;
            reduce_tp_partial(u, model_->grads() + units[size_t(u)].begin);
            tp_fixed_[size_t(u)] = true;
        }
    }
    // A tied embedding (unit 0) is summed with the other end of the
    // pipeline first: its data-parallel reduction waits until then.
    if (has_tied_ && final_from < units[0].end) final_from = units[0].end;
    dp_->sync().on_ready(final_from);
}

void Engine::finish_grads() {
    on_grads_ready(0);
    if (has_tied_) {
        APIARY_PROFILE("tied embedding all-reduce");
        APIARY_TRACE("tied embedding wait", core::trace::Kind::wait);
        const auto t0 = Clock::now();
        const model::ParamInfo& e = model_->registry().entries()[size_t(tied_entry_)];
        tied_group_
            ->all_reduce(model_->grads() + e.offset, e.numel(), DType::f32, comm::ReduceOp::sum,
                         {"tied_grads", 0})
            ->wait();
        times_.pp_wait += seconds_since(t0);
        dp_->sync().on_ready(0);
    }
    APIARY_TRACE("dp wait", core::trace::Kind::wait);
    dp_->sync().finish();
}

double Engine::global_grad_norm() {
    return std::sqrt(sum_over_world(dp_->local_grad_norm_squared()));
}

double Engine::sum_over_world(double v) {
    world_->all_reduce(&v, 1, DType::f64, comm::ReduceOp::sum, {"sum_f64", 0})->wait();
    return v;
}

int64_t Engine::sum_over_world(int64_t v) {
    world_->all_reduce(&v, 1, DType::i64, comm::ReduceOp::sum, {"sum_i64", 0})->wait();
    return v;
}

StepResult Engine::train_step(const int32_t* rows, int64_t n_rows, int64_t T, double lr, bool stop,
                              bool poison) {
    const auto t_start = Clock::now();
    const int m = layout_.microbatches;
    APIARY_CHECK(n_rows % m == 0, "{} rows do not split into {} micro-batches", n_rows, m);
    const int64_t B = n_rows / m;
    times_ = StepTimes{};
    pp_bytes_ = 0;
    tp_->reset_counters();
    ep_->reset_counters();
    dp_->begin_step();
    std::fill(tp_fixed_.begin(), tp_fixed_.end(), false);

    // fp16: the loss (and so every gradient) is multiplied by the scale.
    // Each rank's gradients are of its mean loss; the data-parallel average
    // makes them the gradient of the mean over the global batch.
    const double scale = scaler_.scale();
    const float grad_scale = float(scale / double(B * T * m));
    model::LossResult local;
    run_schedule(rows, B, T, grad_scale, poison, local);
    finish_grads();
    const auto t_opt = Clock::now();
    // The step's scalars, the norm and the update (their collectives nest in it).
    APIARY_TRACE("optimizer", core::trace::Kind::optimizer);
    times_.dp_exposed = dp_->sync().exposed_seconds();
    times_.tp_comm = tp_->seconds();
    times_.ep_comm = ep_->seconds();
    times_.compute -= times_.tp_comm + times_.ep_comm;
    if (times_.forward_ops) times_.forward_op /= times_.forward_ops;
    if (times_.backward_ops) times_.backward_op /= times_.backward_ops;

    // The step's scalars: the loss over the global batch (counted once: by
    // the last stage's first tensor-parallel rank) and the stop request.
    StepResult r;
    r.loss_sum = sum_over_world(local.loss_sum);
    int64_t counts[2] = {local.count, stop ? 1 : 0};
    world_->all_reduce(counts, 2, DType::i64, comm::ReduceOp::sum, {"step_counts", 0})->wait();
    r.count = counts[0];
    r.stop = counts[1] > 0;
    if (exchange_signals_) {
        world_->all_reduce(signals_, 3, DType::f64, comm::ReduceOp::max, {"rank_signals", 0})
            ->wait();
        r.health = int(signals_[0]);
        r.busy_max_s = signals_[1];
        r.busy_min_s = -signals_[2];
    }
    // Every rank reaches the same overflow decision from the same norm.
    const double raw_norm = global_grad_norm();
    r.grad_norm = raw_norm / scale;
    const bool overflow = !std::isfinite(raw_norm);
    r.applied =
        scaler_.update(overflow, dp_->optimizer().step_count() + scaler_.skipped_steps() + 1);
    if (!r.applied) {
        times_.optimizer = seconds_since(t_opt);
        times_.total = seconds_since(t_start);
        return r;
    }
    dp_->step(float(lr), float(1.0 / scale), raw_norm);
    times_.optimizer = seconds_since(t_opt);
    times_.total = seconds_since(t_start);
    return r;
}

model::LossResult Engine::evaluate(const int32_t* rows, int64_t n_rows, int64_t T) {
    const int p = layout_.pp(), s = coord_.pp, v = layout_.virtual_stages;
    const int last = p * v - 1;
    const int64_t B = n_rows;
    const int64_t n = model_->rows(B, T) * spec_.n_embd;
    model::LossResult local;
    for (int c = 0; c < model_->num_chunks(); ++c) {
        const int j = c * p + s;
        if (j == 0 || j == last) unpack(rows, 0, B, T);
        if (j > 0) recv(io_.f32(), n, (s - 1 + p) % p, activation_tag(c));
        model_->forward(c, 0, tokens_.data(), j > 0 ? io_.f32() : nullptr, B, T);
        if (j == last) {
            const model::LossResult r = model_->head_loss(c, 0, targets_.data(), nullptr);
            if (loss_contributor()) local = r;
        } else {
            send(model_->output(c, 0), n, (s + 1) % p, activation_tag(s == p - 1 ? c + 1 : c));
        }
    }
    reap_sends(true);
    model_->end_pass();
    return local;
}

}  // namespace apiary::parallel
