#include "core/allocator.h"

#include <fmt/format.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <new>
#include <string>

#include "core/error.h"

namespace apiary::core {

namespace {
std::mutex g_mutex;
MemStats g_stats;
std::string mib(int64_t bytes) { return fmt::format("{:.1f} MiB", double(bytes) / 1048576.0); }

std::string out_of_memory_message(size_t bytes, MemCategory category, const std::string& what,
                                  int64_t available) {
    const MemStats now = mem_stats();
    std::string held;
    for (int k = 0; k < kNumMemCategories; ++k) {
        if (now.current[k] == 0) continue;
        held += fmt::format("{}{} {}", held.empty() ? "" : ", ", category_name(MemCategory(k)),
                            mib(now.current[k]));
    }
    return fmt::format("out of memory: allocating {} of {}{}{}; apiary already holds {}{}{}",
                       mib(int64_t(bytes)), category_name(category),
                       what.empty() ? "" : " (" + what + ")",
                       available >= 0 ? fmt::format(" with {} available", mib(available)) : "",
                       mib(now.total_current), held.empty() ? "" : " (" + held + ")",
                       "; lower train.batch_size or train.seq_len, or shard the model over more "
                       "ranks (parallel.zero_stage, parallel.tp, parallel.pp)");
}

}  // namespace

int64_t available_memory_bytes() {
    std::ifstream in("/proc/meminfo");
    std::string key;
    int64_t kb = 0;
    std::string unit;
    while (in >> key >> kb) {
        std::getline(in, unit);
        if (key == "MemAvailable:") return kb * 1024;
    }
    return -1;
}

const char* category_name(MemCategory c) {
    switch (c) {
        case MemCategory::params:
            return "params";
        case MemCategory::grads:
            return "grads";
        case MemCategory::optimizer:
            return "optimizer";
        case MemCategory::activations:
            return "activations";
        case MemCategory::buffers:
            return "buffers";
        default:
            return "?";
    }
}

void* mem_allocate(size_t bytes, MemCategory category, const std::string& what) {
    if (bytes == 0) return nullptr;
    const size_t rounded = (bytes + 63) / 64 * 64;
    // With overcommit an allocation larger than the machine can hold
    // succeeds and the zero-fill below summons the OOM killer instead of an
    // error: large ones are checked against what the kernel says is free.
    const int64_t available = rounded >= (size_t(64) << 20) ? available_memory_bytes() : -1;
    void* p =
        available < 0 || int64_t(rounded) <= available ? std::aligned_alloc(64, rounded) : nullptr;
    if (!p) throw OutOfMemoryError(out_of_memory_message(rounded, category, what, available));
    // Zero-filling also faults every page in now, outside the step loop.
    std::memset(p, 0, rounded);
    std::lock_guard lock(g_mutex);
    const int c = static_cast<int>(category);
    g_stats.current[c] += int64_t(bytes);
    g_stats.total_current += int64_t(bytes);
    if (g_stats.current[c] > g_stats.peak[c]) g_stats.peak[c] = g_stats.current[c];
    if (g_stats.total_current > g_stats.total_peak) g_stats.total_peak = g_stats.total_current;
    return p;
}

void mem_release(void* ptr, size_t bytes, MemCategory category) {
    if (!ptr) return;
    std::free(ptr);
    std::lock_guard lock(g_mutex);
    const int c = static_cast<int>(category);
    g_stats.current[c] -= int64_t(bytes);
    g_stats.total_current -= int64_t(bytes);
}

MemStats mem_stats() {
    std::lock_guard lock(g_mutex);
    return g_stats;
}

void mem_reset_peaks() {
    std::lock_guard lock(g_mutex);
    g_stats.peak = g_stats.current;
    g_stats.total_peak = g_stats.total_current;
}

}  // namespace apiary::core
