#include "parallel/data_parallel.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/profile.h"
#include "kernels/kernels.h"

namespace apiary::parallel {

using core::DType;
using core::MemCategory;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void add_bf16(float* dst, const uint16_t* src, int64_t n) {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) dst[i] += core::bf16_to_f32(src[i]);
}

}  // namespace

void DataParallel::check_stage(int zero_stage) {
    if (zero_stage < 0 || zero_stage > 3) {
        throw ConfigError(fmt::format("parallel.zero_stage = {}: known stages are 0 (none), 1 "
                                      "(optimizer state), 2 (+ gradients), 3 (+ parameters)",
                                      zero_stage));
    }
}

model::Storage DataParallel::storage_for(int zero_stage) {
    check_stage(zero_stage);
    if (zero_stage == 3) return model::Storage::sharded;
    if (zero_stage == 2) return model::Storage::sharded_grads;
    return model::Storage::full;
}

DataParallel::DataParallel(comm::ProcessGroup& dp, model::Transformer& model, double bucket_mb,
                           int zero_stage, bool bf16_wire)
    : dp_(dp),
      model_(model),
      zero_stage_(zero_stage),
      bf16_wire_(bf16_wire),
      units_(model.units()) {
    APIARY_CHECK(model.storage() == storage_for(zero_stage),
                 "the model's storage does not match ZeRO stage {}", zero_stage);
    const int64_t flat = model.flat_size();
    const int n = dp.size();
    for (const auto& u : units_) {
        APIARY_CHECK(u.size() % shard_multiple(n) == 0,
                     "unit [{}, {}) does not split into {} aligned pieces", u.begin, u.end, n);
    }
    if (zero_stage_ == 0) {
        // Bucket boundaries fall between parameters (padding included).
        const auto& entries = model.registry().entries();
        std::vector<int64_t> sizes;
        for (size_t i = 0; i < entries.size(); ++i) {
            const int64_t end = i + 1 < entries.size() ? entries[i + 1].offset : flat;
            sizes.push_back(end - entries[i].offset);
        }
        buckets_ = std::make_unique<comm::BucketedAllReduce>(
            dp, model.grads(), comm::make_buckets(sizes, size_t(bucket_mb * 1048576.0)),
            comm::ReduceOp::avg);
        if (bf16_wire_) {
            staging_ = core::Tensor({flat}, DType::bf16, MemCategory::buffers);
            bf16_works_.resize(size_t(buckets_->num_buckets()));
        }
        return;
    }

    // Stages 1-3: this rank's piece of every unit, packed.
    int64_t largest = 0, largest_block = 0;
    for (size_t u = 0; u < units_.size(); ++u) {
        const int64_t count = units_[u].size() / n;
        pieces_.push_back({units_[u].begin + count * dp.rank(), count, packed_size_});
        packed_size_ += count;
        largest = std::max(largest, units_[u].size());
        if (is_block(int(u))) largest_block = std::max(largest_block, units_[u].size());
    }
    // Stages 1-2 update the model's own flat parameters in place (this
    // rank's pieces) and stage 1 reduces the gradients in place: only stage
    // 3 needs packed master parameters and stages 2-3 a packed gradient shard.
    if (zero_stage_ == 3) master_ = core::Tensor({packed_size_}, DType::f32, MemCategory::params);
    if (zero_stage_ >= 2) {
        grad_shard_ = core::Tensor({packed_size_}, DType::f32, MemCategory::grads);
    }
    dp_.reserve_scratch(size_t(largest) * sizeof(float));
    if (zero_stage_ == 1) {
        reduces_.resize(units_.size());
        if (bf16_wire_) {
            staging_ = core::Tensor({flat}, DType::bf16, MemCategory::buffers);
            recv16_ = core::Tensor({packed_size_}, DType::bf16, MemCategory::buffers);
        }
        return;
    }
    // Lent buffers: the embedding and final units get their own (they live
    // through the whole pass), the blocks share two.
    const int post = int(units_.size()) - 1;
    const bool bf16_model = model.precision() == model::Precision::bf16;
    auto make_slots = [&](std::vector<Slot>& slots, MemCategory cat, bool grads) {
        const int64_t sizes[4] = {units_[0].size(), units_[size_t(post)].size(), largest_block,
                                  largest_block};
        slots.resize(4);
        for (int i = 0; i < 4; ++i) {
            const int64_t sz = std::max<int64_t>(sizes[i], 16);
            slots[size_t(i)].buf = core::Tensor({sz}, DType::f32, cat);
            if (!grads) {
                if (bf16_model) slots[size_t(i)].half = core::Tensor({sz}, DType::bf16, cat);
                continue;
            }
            if (bf16_wire_) {
                slots[size_t(i)].wire = core::Tensor({sz}, DType::bf16, MemCategory::buffers);
            }
            slots[size_t(i)].recv = core::Tensor({std::max<int64_t>(sz / n, 16)},
                                                 bf16_wire_ ? DType::bf16 : DType::f32,
                                                 MemCategory::buffers);
        }
    };
    make_slots(gslots_, MemCategory::grads, true);
    if (zero_stage_ == 3) make_slots(pslots_, MemCategory::params, false);
    model_.set_unit_store(this);
}

DataParallel::~DataParallel() {
    model_.set_grad_ready_hook(nullptr);
    if (zero_stage_ >= 2) model_.set_unit_store(nullptr);
}

std::vector<optim::ParamRange> DataParallel::optimizer_ranges() const {
    std::vector<optim::ParamRange> r;
    const auto& entries = model_.registry().entries();
    if (zero_stage_ == 0) {
        for (const auto& e : entries) r.push_back({e.offset, e.numel(), e.decay});
        return r;
    }
    // State packed; parameters in the model's flat buffer below stage 3,
    // gradients there at stage 1 (reduced in place).
    for (const auto& p : pieces_) {
        for (const auto& e : entries) {
            const int64_t lo = std::max(e.offset, p.begin);
            const int64_t hi = std::min(e.offset + e.numel(), p.begin + p.count);
            if (lo >= hi) continue;
            optim::ParamRange range{p.packed + (lo - p.begin), hi - lo, e.decay};
            if (zero_stage_ < 3) range.param_offset = lo;
            if (zero_stage_ == 1) range.grad_offset = lo;
            r.push_back(range);
        }
    }
    return r;
}

int64_t DataParallel::optimizer_size() const {
    return zero_stage_ == 0 ? model_.flat_size() : packed_size_;
}

float* DataParallel::optimizer_params() {
    return zero_stage_ < 3 ? model_.params() : master_.f32();
}

float* DataParallel::optimizer_grads() {
    return zero_stage_ < 2 ? model_.grads() : grad_shard_.f32();
}

void DataParallel::zero_grads() {
    exposed_s_ = 0;
    model_.zero_grads();  // the full buffer, where there is one
    if (zero_stage_ >= 2) grad_shard_.zero();
}

void DataParallel::begin_micro_step(bool last) {
    // Stages 2-3 reduce every micro-step from the lent buffers instead.
    if (!last || zero_stage_ >= 2) {
        model_.set_grad_ready_hook(nullptr);
        return;
    }
    if (zero_stage_ == 0) {
        next_bucket_ = buckets_->num_buckets() - 1;
    } else {
        next_unit_ = int(units_.size()) - 1;
    }
    model_.set_grad_ready_hook([this](int64_t final_from) { on_grads_final(final_from); });
}

void DataParallel::on_grads_final(int64_t final_from) {
    // Buckets complete from the end of the buffer towards its start; every
    // rank starts them in the same (descending) order.
    if (zero_stage_ == 0) {
        while (next_bucket_ >= 0 && buckets_->bucket(next_bucket_).offset >= final_from) {
            start_bucket(next_bucket_--);
        }
        return;
    }
    while (next_unit_ >= 0 && units_[size_t(next_unit_)].begin >= final_from) {
        const int u = next_unit_--;
        const Piece& p = pieces_[size_t(u)];
        const int64_t begin = units_[size_t(u)].begin;
        if (bf16_wire_) {
            start_reduce(u, model_.grads() + begin, staging_.data<uint16_t>() + begin,
                         recv16_.data<uint16_t>() + p.packed, true);
        } else {
            // In place: this rank's piece of the gradients becomes the mean.
            start_reduce(u, model_.grads() + begin, nullptr, model_.grads() + p.begin, false);
        }
    }
}

void DataParallel::start_reduce(int u, const float* src, uint16_t* wire, void* recv, bool add) {
    const Piece& p = pieces_[size_t(u)];
    const int64_t count = units_[size_t(u)].size();
    comm::WorkHandle w;
    if (wire) {
        kernels::to_bf16(wire, src, count);
        w = dp_.reduce_scatter(wire, recv, p.count, DType::bf16, comm::ReduceOp::avg,
                               {"zero_grads", u});
    } else {
        w = dp_.reduce_scatter(src, recv, p.count, DType::f32, comm::ReduceOp::avg,
                               {"zero_grads", u});
    }
    if (zero_stage_ == 1) {
        reduces_[size_t(u)] = {u, std::move(w), add ? recv : nullptr};
    } else {
        Slot* s = grad_slot_for(u);
        s->work = std::move(w);
    }
}

double DataParallel::wait_timed(const comm::WorkHandle& w) {
    const auto t0 = std::chrono::steady_clock::now();
    w->wait();
    return seconds_since(t0);
}

void DataParallel::complete(Reduce& r) {
    if (!r.work) return;
    exposed_s_ += wait_timed(r.work);
    r.work.reset();
    if (r.recv) {
        // Stage 1, bf16 wire: the mean replaces this rank's local piece.
        const Piece& p = pieces_[size_t(r.unit)];
        const uint16_t* src = static_cast<const uint16_t*>(r.recv);
        float* dst = model_.grads() + p.begin;
#pragma omp parallel for simd schedule(static)
        for (int64_t i = 0; i < p.count; ++i) dst[i] = core::bf16_to_f32(src[i]);
    }
}

void DataParallel::complete_slot(Slot& s) {
    if (!s.work) return;
    exposed_s_ += wait_timed(s.work);
    s.work.reset();
    const Piece& p = pieces_[size_t(s.unit)];
    float* dst = grad_shard_.f32() + p.packed;
    if (bf16_wire_) {
        add_bf16(dst, s.recv.data<uint16_t>(), p.count);
    } else {
        kernels::add_inplace(dst, s.recv.f32(), p.count);
    }
}

void DataParallel::start_bucket(int i) {
    if (!bf16_wire_) {
        buckets_->mark_ready(i);
        return;
    }
    start_bucket_bf16(i);
}

void DataParallel::start_bucket_bf16(int i) {
    const auto& b = buckets_->bucket(i);
    uint16_t* stage = staging_.data<uint16_t>() + b.offset;
    kernels::to_bf16(stage, model_.grads() + b.offset, b.count);
    bf16_works_[size_t(i)] =
        dp_.all_reduce(stage, b.count, DType::bf16, comm::ReduceOp::avg, {"bucket", i});
}

void DataParallel::finish_gradients() {
    APIARY_PROFILE("gradient communication wait");
    on_grads_final(0);  // anything backward did not report (none, normally)
    model_.set_grad_ready_hook(nullptr);
    if (zero_stage_ == 0) {
        if (!bf16_wire_) {
            buckets_->finish();
            return;
        }
        const auto t0 = std::chrono::steady_clock::now();
        for (auto& w : bf16_works_) {
            w->wait();
            w.reset();
        }
        exposed_s_ = seconds_since(t0);
        const uint16_t* stage = staging_.data<uint16_t>();
        float* g = model_.grads();
        const int64_t n = model_.flat_size();
#pragma omp parallel for simd schedule(static)
        for (int64_t i = 0; i < n; ++i) g[i] = core::bf16_to_f32(stage[i]);
        return;
    }
    if (zero_stage_ == 1) {
        for (auto& r : reduces_) complete(r);
        return;
    }
    for (auto& s : gslots_) complete_slot(s);
}

double DataParallel::grad_norm(const optim::AdamW& adam) {
    if (zero_stage_ == 0) return adam.grad_norm(model_.grads());
    // Each rank's share of the sum of squares, summed over ranks.
    const double local = adam.grad_norm(optimizer_grads());
    return std::sqrt(sum(local * local));
}

void DataParallel::gather_parameters() {
    if (zero_stage_ == 0) return;
    APIARY_PROFILE("parameter all-gather");
    if (zero_stage_ == 3) {
        // The gathered units are stale now; the next pass gathers afresh.
        for (auto& s : pslots_) {
            if (s.work) s.work->wait();
            s.work.reset();
            APIARY_CHECK(!s.lent, "unit {} still lent at the optimizer step", s.unit);
            s.unit = -1;
            s.valid = false;
            s.half_valid = false;
        }
        return;
    }
    // In place: every rank's updated pieces land in every rank's buffer.
    float* params = model_.params();
    std::vector<comm::WorkHandle> works;
    for (size_t u = 0; u < units_.size(); ++u) {
        const Piece& p = pieces_[u];
        works.push_back(dp_.all_gather(params + p.begin, params + units_[u].begin, p.count,
                                       DType::f32, {"zero_params", int64_t(u)}));
    }
    comm::wait_all(works);
}

void DataParallel::pack(const float* full, float* packed) const {
    APIARY_CHECK(zero_stage_ >= 1, "pack() is for sharded stages");
    for (const auto& p : pieces_) std::memcpy(packed + p.packed, full + p.begin, size_t(p.count) * 4);
}

void DataParallel::gather_full(const float* packed, float* full) {
    if (zero_stage_ == 0) {
        std::memcpy(full, packed, size_t(model_.flat_size()) * sizeof(float));
        return;
    }
    std::vector<comm::WorkHandle> works;
    for (size_t u = 0; u < units_.size(); ++u) {
        const Piece& p = pieces_[u];
        works.push_back(dp_.all_gather(packed + p.packed, full + units_[u].begin, p.count,
                                       DType::f32, {"zero_gather", int64_t(u)}));
    }
    comm::wait_all(works);
}

void DataParallel::load_parameters(const float* full) {
    if (zero_stage_ < 3) return;  // the model's own buffer is the master
    pack(full, master_.f32());
    gather_parameters();  // drops anything gathered before
}

// ---- model::UnitStore (stages 2-3) ----

DataParallel::Slot& DataParallel::param_slot_for(int u) {
    const int post = int(units_.size()) - 1;
    if (u == 0) return pslots_[0];
    if (u == post) return pslots_[1];
    for (int i = 2; i < 4; ++i) {
        if (pslots_[size_t(i)].unit == u) return pslots_[size_t(i)];
    }
    // The block slot not lent; of two free ones, alternate.
    for (int k = 0; k < 2; ++k) {
        const int i = 2 + (next_pblock_ + k) % 2;
        if (!pslots_[size_t(i)].lent) {
            next_pblock_ = (i - 2 + 1) % 2;
            return pslots_[size_t(i)];
        }
    }
    throw Error(fmt::format("ZeRO-3: no free buffer for block unit {} (both are lent)", u));
}

void DataParallel::start_gather(Slot& s, int u) {
    if (s.work) s.work->wait();  // a prefetch into this buffer that was not used
    const Piece& p = pieces_[size_t(u)];
    s.unit = u;
    s.valid = false;
    s.half_valid = false;
    s.work = dp_.all_gather(master_.f32() + p.packed, s.buf.f32(), p.count, DType::f32,
                            {"zero3_params", u});
}

const float* DataParallel::acquire_params(int u, int next) {
    APIARY_PROFILE("parameter all-gather wait");
    Slot& s = param_slot_for(u);
    APIARY_CHECK(!s.lent, "unit {} lent twice", u);
    if (s.unit != u) start_gather(s, u);
    if (s.work) {
        exposed_s_ += wait_timed(s.work);
        s.work.reset();
    }
    s.valid = true;
    s.lent = true;
    if (next >= 0) {
        Slot& n = param_slot_for(next);
        if (n.unit != next && !n.lent) start_gather(n, next);
    }
    return s.buf.f32();
}

const uint16_t* DataParallel::params_bf16(int u) {
    for (auto& s : pslots_) {
        if (s.unit != u || !s.lent) continue;
        APIARY_CHECK(s.half.numel() > 0, "bf16 weights asked of an fp32 model");
        if (!s.half_valid) {
            kernels::to_bf16(s.half.data<uint16_t>(), s.buf.f32(), units_[size_t(u)].size());
            s.half_valid = true;
        }
        return s.half.data<uint16_t>();
    }
    APIARY_CHECK(false, "bf16 weights of unit {} asked while it is not lent", u);
    return nullptr;
}

void DataParallel::release_params(int u) {
    for (auto& s : pslots_) {
        if (s.unit == u && s.lent) {
            s.lent = false;
            return;
        }
    }
    APIARY_CHECK(false, "unit {} released but not lent", u);
}

DataParallel::Slot* DataParallel::grad_slot_for(int u) {
    const int post = int(units_.size()) - 1;
    if (u == 0) return &gslots_[0];
    if (u == post) return &gslots_[1];
    for (int i = 2; i < 4; ++i) {
        if (gslots_[size_t(i)].unit == u) return &gslots_[size_t(i)];
    }
    return nullptr;
}

float* DataParallel::acquire_grads(int u) {
    const int post = int(units_.size()) - 1;
    Slot* s;
    if (u == 0 || u == post) {
        s = &gslots_[u == 0 ? 0 : 1];
    } else {
        s = &gslots_[size_t(2 + next_gblock_)];
        next_gblock_ ^= 1;
    }
    APIARY_CHECK(!s->lent, "gradient buffer for unit {} is still lent (unit {})", u, s->unit);
    complete_slot(*s);  // its previous unit's reduction, if still in flight
    s->unit = u;
    s->lent = true;
    std::memset(s->buf.f32(), 0, size_t(units_[size_t(u)].size()) * sizeof(float));
    return s->buf.f32();
}

void DataParallel::release_grads(int u) {
    Slot* s = grad_slot_for(u);
    APIARY_CHECK(s != nullptr && s->lent, "gradients of unit {} released but not lent", u);
    s->lent = false;
    start_reduce(u, s->buf.f32(), bf16_wire_ ? s->wire.data<uint16_t>() : nullptr,
                 bf16_wire_ ? static_cast<void*>(s->recv.data<uint16_t>())
                            : static_cast<void*>(s->recv.f32()),
                 true);
}

// ----

void DataParallel::sum(float* values, int64_t n) {
    dp_.all_reduce(values, n, DType::f32, comm::ReduceOp::sum, {"scalars", n})->wait();
}

double DataParallel::sum(double v) {
    // f32 on the wire (the backends reduce f32 and bf16): exact for token
    // counts, 7 significant digits for a loss sum or a squared norm.
    float x = float(v);
    dp_.all_reduce(&x, 1, DType::f32, comm::ReduceOp::sum, {"scalar", 0})->wait();
    return double(x);
}

double DataParallel::exposed_seconds() const {
    if (zero_stage_ == 0 && !bf16_wire_) return buckets_->exposed_seconds();
    return exposed_s_;
}

int DataParallel::num_buckets() const {
    return zero_stage_ == 0 ? buckets_->num_buckets() : int(units_.size());
}

int64_t DataParallel::model_state_formula(const model::Transformer& model, int zero_stage,
                                          int dp_size) {
    const int64_t P = model.flat_size(), S = P / dp_size;
    const auto& units = model.units();
    int64_t largest_block = 0;
    for (size_t u = 1; u + 1 < units.size(); ++u) largest_block = std::max(largest_block, units[u].size());
    // The lent buffers of one kind: embedding, final, two blocks.
    const int64_t W = std::max<int64_t>(units.front().size(), 16) +
                      std::max<int64_t>(units.back().size(), 16) + 2 * largest_block;
    int64_t shadow = 0;  // the weight copy in compute precision
    if (model.precision() == model::Precision::bf16) shadow = zero_stage == 3 ? 2 * W : 2 * P;
    if (model.precision() == model::Precision::fp16) shadow = 4 * P;
    switch (zero_stage) {
        case 0: return 16 * P + shadow;
        case 1: return 8 * P + 8 * S + shadow;
        case 2: return 4 * P + 12 * S + 4 * W + shadow;
        default: return 16 * S + 8 * W + shadow;
    }
}

}  // namespace apiary::parallel
