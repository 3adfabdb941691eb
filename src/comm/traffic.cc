#include "comm/traffic.h"

#include <atomic>

namespace apiary::comm {

namespace {

std::atomic<uint64_t> g_bytes[kNumCollOps];
std::atomic<uint64_t> g_calls[kNumCollOps];

}  // namespace

int64_t message_bytes(const Fingerprint& fp, int group_size) {
    const int64_t b = fp.count * int64_t(core::dtype_size(fp.dtype));
    switch (fp.op) {
        case CollOp::reduce_scatter:
        case CollOp::all_gather:
        case CollOp::all_to_all:
            return b * group_size;
        default:
            return b;
    }
}

void count_traffic(CollOp op, int64_t bytes) {
    g_bytes[int(op)].fetch_add(uint64_t(bytes), std::memory_order_relaxed);
    g_calls[int(op)].fetch_add(1, std::memory_order_relaxed);
}

void count_traffic_bytes(CollOp op, int64_t bytes) {
    g_bytes[int(op)].fetch_add(uint64_t(bytes), std::memory_order_relaxed);
}

std::array<uint64_t, kNumCollOps> traffic_bytes() {
    std::array<uint64_t, kNumCollOps> out{};
    for (int i = 0; i < kNumCollOps; ++i)
        out[size_t(i)] = g_bytes[i].load(std::memory_order_relaxed);
    return out;
}

std::array<uint64_t, kNumCollOps> traffic_calls() {
    std::array<uint64_t, kNumCollOps> out{};
    for (int i = 0; i < kNumCollOps; ++i)
        out[size_t(i)] = g_calls[i].load(std::memory_order_relaxed);
    return out;
}

}  // namespace apiary::comm
