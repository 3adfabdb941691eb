#include "parallel/zero.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/profile.h"
#include "core/timing.h"
#include "core/trace.h"
#include "kernels/kernels.h"

namespace apiary::parallel {

using core::DType;
using core::MemCategory;

namespace {

using core::seconds_since;

double wait_and_time(const comm::WorkHandle& w) {
    const auto t0 = core::Clock::now();
    w->wait();
    return seconds_since(t0);
}

void widen_bf16(float* dst, const uint16_t* src, int64_t n, bool add) {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) {
        const float v = core::bf16_to_f32(src[i]);
        dst[i] = add ? dst[i] + v : v;
    }
}

// Waits for every handle still set, ignoring failures: a destructor must
// not leave a collective writing into freed memory, nor throw.
void drain(std::vector<comm::WorkHandle>& works) {
    for (auto& w : works) {
        if (!w) continue;
        try {
            w->wait();
        } catch (...) {
        }
        w.reset();
    }
}

}  // namespace

void check_zero_stage(int zero_stage) {
    if (zero_stage < 0 || zero_stage > 3) {
        throw ConfigError(
            fmt::format("parallel.zero_stage = {}: known stages are 0 (none), 1 "
                        "(optimizer state), 2 (+ gradients), 3 (+ parameters)",
                        zero_stage));
    }
}

model::Storage storage_for(int zero_stage) {
    check_zero_stage(zero_stage);
    if (zero_stage == 3) return model::Storage::sharded;
    if (zero_stage == 2) return model::Storage::sharded_grads;
    return model::Storage::full;
}

int64_t model_state_formula(const model::Transformer& model, int zero_stage, int dp_size) {
    const int64_t P = model.flat_size(), S = P / dp_size;
    const auto& units = model.units();
    int64_t largest_block = 0;
    for (size_t u = 1; u + 1 < units.size(); ++u) {
        largest_block = std::max(largest_block, units[u].size());
    }
    // The lent buffers of one kind: embedding, final, two blocks.
    const int64_t W = std::max<int64_t>(units.front().size(), 16) +
                      std::max<int64_t>(units.back().size(), 16) + 2 * largest_block;
    int64_t shadow = 0;  // the weight copy in compute precision
    if (model.precision() == model::Precision::bf16) shadow = zero_stage == 3 ? 2 * W : 2 * P;
    if (model.precision() == model::Precision::fp16) shadow = 4 * P;
    switch (zero_stage) {
        case 0:
            return 16 * P + shadow;
        case 1:
            return 8 * P + 8 * S + shadow;
        case 2:
            return 4 * P + 12 * S + 4 * W + shadow;
        default:
            return 16 * S + 8 * W + shadow;
    }
}

// ---- DpShards ----

DpShards::DpShards(comm::ProcessGroup& dp, const model::Transformer& model,
                   ExpertGroups experts)
    : dp_(dp), experts_(experts), units_(model.units()) {
    for (int u = 0; u < int(units_.size()); ++u) {
        const model::Unit& unit = units_[size_t(u)];
        const comm::ProcessGroup& g = group_of(u);
        const int n = g.size();
        APIARY_CHECK(unit.size() % shard_multiple(n) == 0,
                     "unit [{}, {}) does not split into {} aligned pieces", unit.begin, unit.end,
                     n);
        const int64_t count = unit.size() / n;
        pieces_.push_back({unit.begin + count * g.rank(), count, packed_size_});
        packed_size_ += count;
    }
}

comm::ProcessGroup& DpShards::group_of(int u) const {
    if (units_[size_t(u)].expert) {
        APIARY_CHECK(experts_.edp != nullptr, "expert unit {} without an expert group", u);
        return *experts_.edp;
    }
    return dp_;
}

void DpShards::pack(const float* full, float* packed) const {
    for (const auto& p : pieces_) {
        std::memcpy(packed + p.packed, full + p.begin, size_t(p.count) * sizeof(float));
    }
}

void DpShards::all_gather_in_place(float* flat) {
    APIARY_PROFILE("parameter all-gather");
    APIARY_TRACE("parameter all-gather", core::trace::Kind::wait);
    std::vector<comm::WorkHandle> works;
    for (size_t u = 0; u < units_.size(); ++u) {
        const Piece& p = pieces_[u];
        if (p.count == 0) continue;
        works.push_back(group_of(int(u)).all_gather(flat + p.begin, flat + units_[u].begin,
                                                    p.count, DType::f32,
                                                    {"zero_params", int64_t(u)}));
    }
    comm::wait_all(works);
}

// ---- expert units (ep > 1) ----

ExpertReductions::ExpertReductions(ExpertGroups experts, model::Transformer& model,
                                   const DpShards* shards)
    : experts_(experts), model_(model), shards_(shards), units_(model.units()) {
    APIARY_CHECK(experts_.edp != nullptr && experts_.ep > 1, "expert reductions without ep");
    works_.resize(units_.size());
    reset();
}

ExpertReductions::~ExpertReductions() { drain(works_); }

int ExpertReductions::on_ready(int64_t final_from) {
    int started = 0;
    comm::ProcessGroup& edp = *experts_.edp;
    while (next_ >= 0 && units_[size_t(next_)].begin >= final_from) {
        const int u = next_--;
        const model::Unit& unit = units_[size_t(u)];
        if (!unit.expert || unit.size() == 0) continue;
        float* g = model_.grads() + unit.begin;
        kernels::scale_inplace(g, unit.size(), 1.0f / float(experts_.ep));
        if (shards_) {
            const auto& p = shards_->pieces()[size_t(u)];
            works_[size_t(u)] = edp.reduce_scatter(g, model_.grads() + p.begin, p.count,
                                                   DType::f32, comm::ReduceOp::avg,
                                                   {"expert_grads", u});
        } else {
            works_[size_t(u)] = edp.all_reduce(g, unit.size(), DType::f32, comm::ReduceOp::avg,
                                               {"expert_grads", u});
        }
        ++started;
    }
    return started;
}

double ExpertReductions::finish() {
    on_ready(0);
    double waited = 0;
    for (auto& w : works_) {
        if (!w) continue;
        waited += wait_and_time(w);
        w.reset();
    }
    return waited;
}

// ---- stage 0 ----

AllReduceSync::AllReduceSync(comm::ProcessGroup& dp, model::Transformer& model, double bucket_mb,
                             bool bf16_wire, ExpertGroups experts)
    : dp_(dp), model_(model), bf16_wire_(bf16_wire) {
    // Bucket boundaries fall between parameters (padding included), over
    // each run of units that are not routed experts (those reduce apart).
    const auto& entries = model.registry().entries();
    const auto& units = model.units();
    std::vector<comm::BucketRange> buckets;
    for (size_t a = 0; a < units.size();) {
        if (units[a].expert) {
            ++a;
            continue;
        }
        size_t b = a;
        while (b + 1 < units.size() && !units[b + 1].expert) ++b;
        const int64_t rb = units[a].begin, re = units[b].end;
        std::vector<int64_t> sizes;
        for (size_t i = 0; i < entries.size(); ++i) {
            const int64_t at = entries[i].offset;
            if (at < rb || at >= re) continue;
            if (sizes.empty() && at > rb) sizes.push_back(at - rb);
            const int64_t next = i + 1 < entries.size() ? entries[i + 1].offset : re;
            sizes.push_back(std::min(next, re) - at);
        }
        if (sizes.empty() && re > rb) sizes.push_back(re - rb);
        for (auto r : comm::make_buckets(sizes, size_t(bucket_mb * 1048576.0))) {
            r.offset += rb;
            buckets.push_back(r);
        }
        a = b + 1;
    }
    buckets_ = std::make_unique<comm::BucketedAllReduce>(dp, model.grads(), std::move(buckets),
                                                         comm::ReduceOp::avg);
    if (experts.ep > 1) experts_ = std::make_unique<ExpertReductions>(experts, model, nullptr);
    if (bf16_wire_) {
        staging_ = core::Tensor({model.flat_size()}, DType::bf16, MemCategory::buffers);
        bf16_works_.resize(size_t(buckets_->num_buckets()));
    }
    reset();
}

AllReduceSync::~AllReduceSync() { drain(bf16_works_); }

void AllReduceSync::reset() {
    next_ = buckets_->num_buckets() - 1;
    exposed_s_ = 0;
    reset_counts();
    if (experts_) experts_->reset();
}

void AllReduceSync::start(int i) {
    count_start();
    if (!bf16_wire_) {
        buckets_->mark_ready(i);
        return;
    }
    const auto& b = buckets_->bucket(i);
    uint16_t* stage = staging_.data<uint16_t>() + b.offset;
    kernels::to_bf16(stage, model_.grads() + b.offset, b.count);
    bf16_works_[size_t(i)] =
        dp_.all_reduce(stage, b.count, DType::bf16, comm::ReduceOp::avg, {"bucket", i});
}

void AllReduceSync::on_ready(int64_t final_from) {
    // Buckets complete from the end of the buffer towards its start; every
    // rank starts them in the same (descending) order.
    while (next_ >= 0 && buckets_->bucket(next_).offset >= final_from) start(next_--);
    if (experts_) {
        for (int i = experts_->on_ready(final_from); i > 0; --i) count_start();
    }
}

void AllReduceSync::finish() {
    APIARY_PROFILE("gradient communication wait");
    APIARY_TRACE("dp wait", core::trace::Kind::wait);
    on_ready(0);
    if (experts_) exposed_s_ = experts_->finish();
    if (!bf16_wire_) {
        buckets_->finish();
        return;
    }
    const auto t0 = core::Clock::now();
    for (auto& w : bf16_works_) {
        w->wait();
        w.reset();
    }
    exposed_s_ += seconds_since(t0);
    for (int i = 0; i < buckets_->num_buckets(); ++i) {
        const auto& b = buckets_->bucket(i);
        widen_bf16(model_.grads() + b.offset, staging_.data<uint16_t>() + b.offset, b.count,
                   false);
    }
}

double AllReduceSync::exposed_seconds() const {
    return bf16_wire_ ? exposed_s_ : buckets_->exposed_seconds() + exposed_s_;
}

// ---- stage 1 ----

ReduceScatterSync::ReduceScatterSync(comm::ProcessGroup& dp, model::Transformer& model,
                                     const DpShards& shards, bool bf16_wire,
                                     ExpertGroups experts)
    : dp_(dp), model_(model), shards_(shards), bf16_wire_(bf16_wire), units_(model.units()) {
    works_.resize(units_.size());
    if (experts.ep > 1) experts_ = std::make_unique<ExpertReductions>(experts, model, &shards);
    int64_t largest = 0;
    for (const auto& u : units_) largest = std::max(largest, u.size());
    // The reduce-scatter of the largest unit needs the most scratch (the
    // comm layer bounds it by its piece size, not by the unit).
    dp_.reserve_scratch(comm::CollOp::reduce_scatter, largest / dp.size(),
                        bf16_wire_ ? DType::bf16 : DType::f32);
    if (bf16_wire_) {
        staging_ = core::Tensor({model.flat_size()}, DType::bf16, MemCategory::buffers);
        recv16_ = core::Tensor({std::max<int64_t>(shards.packed_size(), 16)}, DType::bf16,
                               MemCategory::buffers);
    }
    reset();
}

ReduceScatterSync::~ReduceScatterSync() { drain(works_); }

void ReduceScatterSync::reset() {
    next_ = int(units_.size()) - 1;
    exposed_s_ = 0;
    reset_counts();
    if (experts_) experts_->reset();
}

void ReduceScatterSync::on_ready(int64_t final_from) {
    if (experts_) {
        for (int i = experts_->on_ready(final_from); i > 0; --i) count_start();
    }
    while (next_ >= 0 && units_[size_t(next_)].begin >= final_from) {
        const int u = next_--;
        const auto& p = shards_.pieces()[size_t(u)];
        if (p.count == 0 || units_[size_t(u)].expert) continue;
        count_start();
        float* g = model_.grads();
        const int64_t begin = units_[size_t(u)].begin;
        if (bf16_wire_) {
            uint16_t* wire = staging_.data<uint16_t>() + begin;
            kernels::to_bf16(wire, g + begin, units_[size_t(u)].size());
            works_[size_t(u)] =
                dp_.reduce_scatter(wire, recv16_.data<uint16_t>() + p.packed, p.count, DType::bf16,
                                   comm::ReduceOp::avg, {"zero_grads", u});
        } else {
            // In place: this rank's piece of the gradients becomes the mean.
            works_[size_t(u)] = dp_.reduce_scatter(g + begin, g + p.begin, p.count, DType::f32,
                                                   comm::ReduceOp::avg, {"zero_grads", u});
        }
    }
}

void ReduceScatterSync::finish() {
    APIARY_PROFILE("gradient communication wait");
    APIARY_TRACE("dp wait", core::trace::Kind::wait);
    on_ready(0);
    if (experts_) exposed_s_ += experts_->finish();
    for (size_t u = 0; u < works_.size(); ++u) {
        if (!works_[u]) continue;
        exposed_s_ += wait_and_time(works_[u]);
        works_[u].reset();
        if (bf16_wire_) {
            // The mean replaces this rank's local piece.
            const auto& p = shards_.pieces()[u];
            widen_bf16(model_.grads() + p.begin, recv16_.data<uint16_t>() + p.packed, p.count,
                       false);
        }
    }
}

// ---- stages 2-3 ----

ShardedStore::ShardedStore(comm::ProcessGroup& dp, model::Transformer& model, DpShards& shards,
                           int zero_stage, bool bf16_wire, int ep)
    : dp_(dp),
      model_(model),
      shards_(shards),
      zero_stage_(zero_stage),
      bf16_wire_(bf16_wire),
      ep_(ep),
      units_(model.units()) {
    APIARY_CHECK(model.storage() == storage_for(zero_stage),
                 "the model's storage does not match ZeRO stage {}", zero_stage);
    APIARY_CHECK(ep_ == 1 || zero_stage_ == 2, "expert parallelism at ZeRO stage {}", zero_stage);
    // The smallest group a unit is reduced over (the edp group's, under
    // expert parallelism) gives the largest piece that comes back.
    int n = dp.size();
    for (int u = 0; u < int(units_.size()); ++u) n = std::min(n, shards.group_of(u).size());
    const int64_t packed = shards.packed_size();
    int64_t largest = 0, largest_block = 0;
    const int post = int(units_.size()) - 1;
    for (int u = 0; u <= post; ++u) {
        largest = std::max(largest, units_[size_t(u)].size());
        if (u >= 1 && u < post) largest_block = std::max(largest_block, units_[size_t(u)].size());
    }
    if (zero_stage_ == 3) master_ = core::Tensor({packed}, DType::f32, MemCategory::params);
    grad_shard_ = core::Tensor({packed}, DType::f32, MemCategory::grads);
    dp_.reserve_scratch(comm::CollOp::reduce_scatter, largest / n,
                        bf16_wire_ ? DType::bf16 : DType::f32);
    // Lent buffers: the embedding and final units get their own (they live
    // through the whole step), the blocks share two.
    const bool bf16_model = model.precision() == model::Precision::bf16;
    auto make_slots = [&](std::vector<Slot>& slots, MemCategory cat, bool grads) {
        const int64_t sizes[4] = {units_[0].size(), units_[size_t(post)].size(), largest_block,
                                  largest_block};
        slots.resize(4);
        for (int i = 0; i < 4; ++i) {
            const int64_t sz = std::max<int64_t>(sizes[i], 16);
            Slot& s = slots[size_t(i)];
            s.buf = core::Tensor({sz}, DType::f32, cat);
            if (!grads) {
                if (bf16_model) s.half = core::Tensor({sz}, DType::bf16, cat);
                continue;
            }
            if (bf16_wire_) s.wire = core::Tensor({sz}, DType::bf16, MemCategory::buffers);
            s.recv = core::Tensor({std::max<int64_t>(sz / n, 16)},
                                  bf16_wire_ ? DType::bf16 : DType::f32, MemCategory::buffers);
        }
    };
    make_slots(gslots_, MemCategory::grads, true);
    if (zero_stage_ == 3) make_slots(pslots_, MemCategory::params, false);
    model_.set_unit_store(this);
}

ShardedStore::~ShardedStore() {
    model_.set_unit_store(nullptr);
    for (auto* slots : {&pslots_, &gslots_}) {
        std::vector<comm::WorkHandle> works;
        for (auto& s : *slots) works.push_back(std::move(s.work));
        drain(works);
    }
}

double ShardedStore::wait_timed(const comm::WorkHandle& w) { return wait_and_time(w); }

void ShardedStore::load_parameters(const float* full) {
    APIARY_CHECK(zero_stage_ == 3, "load_parameters is for stage 3");
    shards_.pack(full, master_.f32());
    invalidate_params();
}

void ShardedStore::invalidate_params() {
    // The gathered units are stale now; the next pass gathers afresh.
    for (auto& s : pslots_) {
        if (s.work) s.work->wait();
        s.work.reset();
        APIARY_CHECK(!s.lent, "unit {} still lent at the optimizer step", s.unit);
        s.unit = -1;
        s.half_valid = false;
    }
}

ShardedStore::Slot& ShardedStore::param_slot_for(int u) {
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

void ShardedStore::start_gather(Slot& s, int u) {
    if (s.work) s.work->wait();  // a prefetch into this buffer that was not used
    const auto& p = shards_.pieces()[size_t(u)];
    s.unit = u;
    s.half_valid = false;
    s.work = dp_.all_gather(master_.f32() + p.packed, s.buf.f32(), p.count, DType::f32,
                            {"zero3_params", u});
}

const float* ShardedStore::acquire_params(int u, int next) {
    APIARY_PROFILE("parameter all-gather wait");
    APIARY_TRACE("parameter gather wait", core::trace::Kind::wait);
    Slot& s = param_slot_for(u);
    APIARY_CHECK(!s.lent, "unit {} lent twice", u);
    if (s.unit != u) start_gather(s, u);
    if (s.work) {
        exposed_s_ += wait_timed(s.work);
        s.work.reset();
    }
    s.lent = true;
    if (next >= 0) {
        Slot& nx = param_slot_for(next);
        if (nx.unit != next && !nx.lent) start_gather(nx, next);
    }
    return s.buf.f32();
}

const uint16_t* ShardedStore::params_bf16(int u) {
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

void ShardedStore::release_params(int u) {
    for (auto& s : pslots_) {
        if (s.unit == u && s.lent) {
            s.lent = false;
            return;
        }
    }
    APIARY_CHECK(false, "unit {} released but not lent", u);
}

ShardedStore::Slot* ShardedStore::grad_slot_for(int u) {
    const int post = int(units_.size()) - 1;
    if (u == 0) return &gslots_[0];
    if (u == post) return &gslots_[1];
    // The lent one: with a single block both buffers take turns holding it,
    // and the other still names it from the step before.
    for (int i = 2; i < 4; ++i) {
        if (gslots_[size_t(i)].unit == u && gslots_[size_t(i)].lent) return &gslots_[size_t(i)];
    }
    return nullptr;
}

void ShardedStore::complete_grads(Slot& s) {
    if (!s.work) return;
    exposed_s_ += wait_timed(s.work);
    s.work.reset();
    const auto& p = shards_.pieces()[size_t(s.unit)];
    float* dst = grad_shard_.f32() + p.packed;
    if (bf16_wire_) {
        widen_bf16(dst, s.recv.data<uint16_t>(), p.count, true);
    } else {
        kernels::add_inplace(dst, s.recv.f32(), p.count);
    }
}

float* ShardedStore::acquire_grads(int u) {
    const int post = int(units_.size()) - 1;
    Slot* s;
    if (u == 0 || u == post) {
        s = &gslots_[u == 0 ? 0 : 1];
    } else {
        s = &gslots_[size_t(2 + next_gblock_)];
        next_gblock_ ^= 1;
    }
    APIARY_CHECK(!s->lent, "gradient buffer for unit {} is still lent (unit {})", u, s->unit);
    complete_grads(*s);  // its previous unit's reduction, if still in flight
    s->unit = u;
    s->lent = true;
    std::memset(s->buf.f32(), 0, size_t(units_[size_t(u)].size()) * sizeof(float));
    return s->buf.f32();
}

void ShardedStore::release_grads(int u) {
    Slot* s = grad_slot_for(u);
    APIARY_CHECK(s != nullptr && s->lent, "gradients of unit {} released but not lent", u);
    s->lent = false;
    if (before_reduce_) before_reduce_(u, s->buf.f32());
    const auto& p = shards_.pieces()[size_t(u)];
    const int64_t count = units_[size_t(u)].size();
    // An expert unit's mean is over all dp ranks: 1 / ep of its edp mean.
    if (units_[size_t(u)].expert) kernels::scale_inplace(s->buf.f32(), count, 1.0f / float(ep_));
    comm::ProcessGroup& g = shards_.group_of(u);
    count_start();
    if (bf16_wire_) {
        kernels::to_bf16(s->wire.data<uint16_t>(), s->buf.f32(), count);
        s->work = g.reduce_scatter(s->wire.data<uint16_t>(), s->recv.data<uint16_t>(), p.count,
                                   DType::bf16, comm::ReduceOp::avg, {"zero_grads", u});
    } else {
        s->work = g.reduce_scatter(s->buf.f32(), s->recv.f32(), p.count, DType::f32,
                                   comm::ReduceOp::avg, {"zero_grads", u});
    }
}

void ShardedStore::finish() {
    APIARY_PROFILE("gradient communication wait");
    APIARY_TRACE("dp wait", core::trace::Kind::wait);
    for (auto& s : gslots_) complete_grads(s);
}

}  // namespace apiary::parallel
