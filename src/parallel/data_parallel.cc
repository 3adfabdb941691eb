#include "parallel/data_parallel.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "kernels/kernels.h"

namespace apiary::parallel {

DataParallel::DataParallel(comm::ProcessGroup& dp, model::Transformer& model, double bucket_mb,
                           int zero_stage, bool bf16_wire)
    : dp_(dp), model_(model), zero_stage_(zero_stage), bf16_wire_(bf16_wire) {
    if (zero_stage < 0 || zero_stage > 1) {
        throw ConfigError(fmt::format("parallel.zero_stage = {}: this build shards the optimizer "
                                      "state (stage 1); stages 2 and 3 are not available yet",
                                      zero_stage));
    }
    const int64_t flat = model.flat_size();
    APIARY_CHECK(flat % shard_multiple(dp.size()) == 0,
                 "flat buffer of {} floats does not split into {} aligned shards", flat,
                 dp.size());
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
        staging_ = core::Tensor({flat}, core::DType::bf16, core::MemCategory::buffers);
        bf16_works_.resize(size_t(buckets_->num_buckets()));
    }
    const int64_t shard = flat / dp.size();
    if (zero_stage_ >= 1) {
        shard_begin_ = shard * dp.rank();
        shard_end_ = shard_begin_ + shard;
    } else {
        shard_begin_ = 0;
        shard_end_ = flat;
    }
}

DataParallel::~DataParallel() { model_.set_grad_ready_hook(nullptr); }

void DataParallel::begin_micro_step(bool last) {
    if (!last) {
        model_.set_grad_ready_hook(nullptr);
        return;
    }
    next_bucket_ = buckets_->num_buckets() - 1;
    model_.set_grad_ready_hook([this](int64_t final_from) { on_grads_final(final_from); });
}

void DataParallel::on_grads_final(int64_t final_from) {
    // Buckets complete from the end of the buffer towards its start; every
    // rank starts them in the same (descending) order.
    while (next_bucket_ >= 0 && buckets_->bucket(next_bucket_).offset >= final_from) {
        start_bucket(next_bucket_--);
    }
}

void DataParallel::start_bucket(int i) {
    if (!bf16_wire_) {
        buckets_->mark_ready(i);
        return;
    }
    const auto& b = buckets_->bucket(i);
    uint16_t* stage = staging_.data<uint16_t>() + b.offset;
    kernels::to_bf16(stage, model_.grads() + b.offset, b.count);
    bf16_works_[size_t(i)] =
        dp_.all_reduce(stage, b.count, core::DType::bf16, comm::ReduceOp::avg, {"bucket", i});
}

void DataParallel::finish_gradients() {
    on_grads_final(0);  // anything backward did not report (none, normally)
    if (!bf16_wire_) {
        buckets_->finish();
    } else {
        const auto t0 = std::chrono::steady_clock::now();
        for (auto& w : bf16_works_) {
            w->wait();
            w.reset();
        }
        exposed_s_ =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const uint16_t* stage = staging_.data<uint16_t>();
        float* g = model_.grads();
        const int64_t n = model_.flat_size();
#pragma omp parallel for simd schedule(static)
        for (int64_t i = 0; i < n; ++i) g[i] = core::bf16_to_f32(stage[i]);
    }
    model_.set_grad_ready_hook(nullptr);
}

void DataParallel::gather_parameters() {
    if (zero_stage_ == 0) return;
    float* p = model_.params();
    const int64_t shard = shard_end_ - shard_begin_;
    dp_.all_gather(p + shard_begin_, p, shard, core::DType::f32, {"zero1_params", 0})->wait();
}

void DataParallel::gather_shards(const float* shard, float* full) {
    const int64_t n = shard_end_ - shard_begin_;
    if (zero_stage_ == 0) {
        std::copy_n(shard, n, full);
        return;
    }
    dp_.all_gather(shard, full, n, core::DType::f32, {"zero1_state", 0})->wait();
}

void DataParallel::sum(float* values, int64_t n) {
    dp_.all_reduce(values, n, core::DType::f32, comm::ReduceOp::sum, {"scalars", n})->wait();
}

double DataParallel::sum(double v) {
    // f32 on the wire (the backends reduce f32 and bf16): exact for token
    // counts, 7 significant digits for a loss sum, which only feeds logs.
    float x = float(v);
    dp_.all_reduce(&x, 1, core::DType::f32, comm::ReduceOp::sum, {"scalar", 0})->wait();
    return double(x);
}

}  // namespace apiary::parallel
