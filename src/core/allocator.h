#pragma once
// Every byte apiary allocates for model state goes through here, tagged with a
// category, so that memory can be reported (and checked against the planner's
// formulas) per category with its peak.

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

namespace apiary::core {

enum class MemCategory : int { params, grads, optimizer, activations, buffers, kCount };
constexpr int kNumMemCategories = static_cast<int>(MemCategory::kCount);
const char* category_name(MemCategory c);

struct MemStats {
    std::array<int64_t, kNumMemCategories> current{};
    std::array<int64_t, kNumMemCategories> peak{};  // per-category high-water marks
    int64_t total_current = 0;
    int64_t total_peak = 0;  // high-water mark of the sum, not the sum of peaks
};

// 64-byte aligned, zero-filled memory, accounted by category. Thread-safe.
// Throws OutOfMemoryError naming the size, the category and what is already
// held, when the allocation fails or exceeds the memory the kernel reports
// available (checked for allocations of 64 MiB and more).
// `what` describes the allocation in that message (e.g. a tensor's shape).
void* mem_allocate(size_t bytes, MemCategory category, const std::string& what = "");
// MemAvailable from /proc/meminfo, or -1.
int64_t available_memory_bytes();
void mem_release(void* ptr, size_t bytes, MemCategory category);
MemStats mem_stats();
// Forget peaks (current stays), e.g. between benchmark phases.
void mem_reset_peaks();

}  // namespace apiary::core
