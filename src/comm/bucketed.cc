#include "comm/bucketed.h"

#include <fmt/format.h>

#include "core/error.h"
#include "core/timing.h"

namespace apiary::comm {

std::vector<BucketRange> make_buckets(const std::vector<int64_t>& param_numels,
                                      size_t bucket_bytes) {
    const int64_t cap = std::max<int64_t>(1, int64_t(bucket_bytes / sizeof(float)));
    std::vector<BucketRange> out;
    int64_t offset = 0;
    BucketRange cur{0, 0};
    for (int64_t n : param_numels) {
        APIARY_CHECK(n >= 0, "parameter size {} < 0", n);
        if (cur.count > 0 && cur.count + n > cap) {
            out.push_back(cur);
            cur = {offset, 0};
        }
        cur.count += n;
        offset += n;
    }
    if (cur.count > 0) out.push_back(cur);
    return out;
}

BucketedAllReduce::BucketedAllReduce(ProcessGroup& group, float* grads,
                                     std::vector<BucketRange> buckets, ReduceOp op)
    : group_(group),
      grads_(grads),
      buckets_(std::move(buckets)),
      op_(op),
      works_(buckets_.size()) {}

BucketedAllReduce::~BucketedAllReduce() {
    // A step abandoned by an exception must not leave MPI writing into freed memory.
    for (auto& w : works_) {
        if (!w) continue;
        try {
            w->wait();
        } catch (...) {
        }
    }
}

void BucketedAllReduce::mark_ready(int i) {
    APIARY_CHECK(i >= 0 && i < num_buckets(), "bucket {} outside 0..{}", i, num_buckets() - 1);
    APIARY_CHECK(!works_[size_t(i)], "bucket {} marked ready twice in one step", i);
    const auto& b = buckets_[size_t(i)];
    works_[size_t(i)] =
        group_.all_reduce(grads_ + b.offset, b.count, DType::f32, op_, Tag{"bucket", i});
}

void BucketedAllReduce::finish() {
    const auto t0 = core::Clock::now();
    for (size_t i = 0; i < works_.size(); ++i) {
        if (!works_[i]) {
            throw CommError(
                fmt::format("{}: bucket {} was never marked ready this step; "
                            "every gradient must be produced before finish()",
                            group_.name(), i));
        }
    }
    for (auto& w : works_) {
        w->wait();
        w.reset();
    }
    exposed_s_ = core::seconds_since(t0);
}

}  // namespace apiary::comm
