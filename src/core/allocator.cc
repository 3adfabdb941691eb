#include "core/allocator.h"

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>

namespace apiary::core {

namespace {
std::mutex g_mutex;
MemStats g_stats;
}  // namespace

const char* category_name(MemCategory c) {
    switch (c) {
        case MemCategory::params: return "params";
        case MemCategory::grads: return "grads";
        case MemCategory::optimizer: return "optimizer";
        case MemCategory::activations: return "activations";
        case MemCategory::buffers: return "buffers";
        default: return "?";
    }
}

void* mem_allocate(size_t bytes, MemCategory category) {
    if (bytes == 0) return nullptr;
    const size_t rounded = (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded);
    if (!p) throw std::bad_alloc();
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
