#include "parallel/data_parallel.h"

#include <algorithm>
#include <utility>

#include "core/error.h"
#include "core/timing.h"

namespace apiary::parallel {

const char* state_name(StateKind kind) {
    switch (kind) {
        case StateKind::param: return "param";
        case StateKind::adam_m: return "adam_m";
        case StateKind::adam_v: return "adam_v";
    }
    return "?";
}

DataParallel::DataParallel(comm::ProcessGroup& group, model::Transformer& model,
                           const DataParallelOptions& o,
                           std::function<void(int, float*)> before_reduce)
    : group_(group),
      model_(model),
      experts_(o.experts),
      zero_(group.size() == 1 ? 0 : o.zero_stage) {
    check_zero_stage(zero_);
    APIARY_CHECK(experts_.ep == 1 || (experts_.edp && zero_ <= 2),
                 "expert parallelism over {} ranks at ZeRO stage {}", experts_.ep, zero_);
    if (group_.size() == 1) {
        sync_ = std::make_unique<LocalSync>();
    } else {
        if (zero_ >= 1) shards_ = std::make_unique<DpShards>(group_, model_, experts_);
        if (zero_ == 0) {
            sync_ = std::make_unique<AllReduceSync>(group_, model_, o.bucket_mb, o.bf16_wire,
                                                    experts_);
        } else if (zero_ == 1) {
            sync_ = std::make_unique<ReduceScatterSync>(group_, model_, *shards_, o.bf16_wire,
                                                        experts_);
        } else {
            auto store = std::make_unique<ShardedStore>(group_, model_, *shards_, zero_,
                                                        o.bf16_wire, experts_.ep);
            store->set_before_reduce(std::move(before_reduce));
            store_ = store.get();
            sync_ = std::move(store);
        }
    }
    // Every rank saves the r-th equal piece of each unit (units are padded
    // to shard_multiple(dp)): at stages 1-3 exactly its ZeRO pieces. An
    // expert unit (ep > 1) is split over the ranks holding those experts
    // (the edp group), so that each expert is saved once.
    int64_t packed = 0;
    for (const auto& u : model_.units()) {
        const bool ex = u.expert && experts_.edp;
        const int dp = ex ? experts_.edp->size() : group_.size();
        const int r = ex ? experts_.edp->rank() : group_.rank();
        const int64_t count = u.size() / dp;
        saved_.push_back({u.begin + count * r, u.begin + count * (r + 1)});
        saved_packed_.push_back(packed);
        packed += count;
    }
    build_optimizer(o);
}

void DataParallel::build_optimizer(const DataParallelOptions& o) {
    const auto& entries = model_.registry().entries();
    auto frozen = [&](const model::ParamInfo& e) {
        for (const auto& prefix : o.freeze) {
            if (e.name.rfind(prefix, 0) == 0) return true;
        }
        return false;
    };
    // A gradient counts in the global norm on one rank only.
    auto counted = [&](const model::ParamInfo& e) {
        if (e.tied_copy || frozen(e)) return false;
        if (o.tp_rank != 0 && !e.split()) return false;
        // Whole on every rank: the first of the group that holds it counts it.
        const bool ex = e.expert && experts_.edp;
        return zero_ > 0 || (ex ? experts_.edp->rank() : group_.rank()) == 0;
    };
    std::vector<optim::ParamRange> ranges;
    if (zero_ == 0) {
        for (const auto& e : entries) {
            optim::ParamRange r{e.offset, e.numel(), e.decay};
            r.in_norm = counted(e);
            r.frozen = frozen(e);
            ranges.push_back(r);
        }
        adam_ = std::make_unique<optim::AdamW>(ranges, model_.flat_size(), o.adamw);
        return;
    }
    // ZeRO: the state is this rank's pieces, packed; parameters stay in the
    // flat buffer below stage 3, gradients below stage 2.
    for (const auto& piece : shards_->pieces()) {
        for (const auto& e : entries) {
            const int64_t lo = std::max(e.offset, piece.begin);
            const int64_t hi = std::min(e.offset + e.numel(), piece.begin + piece.count);
            if (lo >= hi) continue;
            optim::ParamRange r{piece.packed + (lo - piece.begin), hi - lo, e.decay};
            if (zero_ < 3) r.param_offset = lo;
            if (zero_ == 1) r.grad_offset = lo;
            r.in_norm = counted(e);
            r.frozen = frozen(e);
            ranges.push_back(r);
        }
    }
    adam_ = std::make_unique<optim::AdamW>(ranges, shards_->packed_size(), o.adamw);
}

void DataParallel::init(uint64_t seed) {
    if (zero_ == 3) {
        // Every element is a pure function of (seed, name, index): the
        // whole shard is made once here and each rank keeps its pieces.
        std::vector<float> full(size_t(model_.flat_size()));
        model_.init_into(seed, full.data());
        store_->load_parameters(full.data());
        return;
    }
    model_.init(seed);
}

void DataParallel::begin_step() {
    sync_->reset();
    if (model_.storage() == model::Storage::full) model_.zero_grads();
    if (store_) store_->zero_grads();
}

const float* DataParallel::grads() const {
    return zero_ >= 2 ? store_->grad_shard() : model_.grads();
}

double DataParallel::local_grad_norm_squared() const {
    const double local = adam_->grad_norm(grads());
    return local * local;
}

void DataParallel::step(float lr, float inv_scale, double raw_norm) {
    // bf16: the optimizer writes the bf16 weight copy as it goes when it
    // updates every parameter (not under ZeRO: the gather below marks the
    // copy stale, and it is cast again before the forward).
    const bool whole = zero_ == 0 && adam_->updates_all_params();
    uint16_t* copy = whole ? model_.bf16_weights() : nullptr;
    float* params = zero_ == 3 ? store_->master_params() : model_.params();
    adam_->step(params, grads(), lr, inv_scale, raw_norm, copy);
    if (copy) model_.bf16_weights_written();
    if (zero_ == 1 || zero_ == 2) shards_->all_gather_in_place(model_.params());
    if (zero_ == 3) store_->invalidate_params();
}

void DataParallel::state_loaded() {
    if (zero_ == 3) {
        store_->invalidate_params();
    } else {
        model_.params();  // marks the weight copy stale
    }
}

double DataParallel::reduction_alone_seconds() {
    if (group_.size() == 1 || store_) return 0.0;
    const auto t0 = core::Clock::now();
    sync_->reset();
    sync_->on_ready(0);
    sync_->finish();
    return core::seconds_since(t0);
}

bool DataParallel::holds_whole(StateKind kind) const {
    return kind == StateKind::param ? zero_ < 3 : zero_ < 1;
}

int64_t DataParallel::packed_offset(int64_t flat) const {
    // The saved ranges ascend: the last one starting at or before `flat`.
    auto it = std::upper_bound(saved_.begin(), saved_.end(), flat,
                               [](int64_t f, const FlatRange& r) { return f < r.begin; });
    APIARY_CHECK(it != saved_.begin(), "flat offset {} is not in this rank's pieces", flat);
    const size_t i = size_t(it - saved_.begin()) - 1;
    APIARY_CHECK(flat < saved_[i].end, "flat offset {} is not in this rank's pieces", flat);
    return saved_packed_[i] + (flat - saved_[i].begin);
}

const float* DataParallel::state_at(StateKind kind, int64_t flat) const {
    const int64_t at = holds_whole(kind) ? flat : packed_offset(flat);
    const model::Transformer& m = model_;
    switch (kind) {
        case StateKind::param: return (zero_ == 3 ? store_->master_params() : m.params()) + at;
        case StateKind::adam_m: return adam_->m() + at;
        case StateKind::adam_v: return adam_->v() + at;
    }
    return nullptr;
}

float* DataParallel::state_at(StateKind kind, int64_t flat) {
    if (kind == StateKind::param && zero_ < 3) model_.params();  // marks the copy stale
    return const_cast<float*>(std::as_const(*this).state_at(kind, flat));
}

}  // namespace apiary::parallel
