#include "device/buffer.h"

#include <fmt/format.h>

#include <cstdlib>
#include <utility>

#include "core/error.h"

namespace apiary::device {

std::string format_bytes(int64_t bytes) {
    const double b = double(bytes);
    if (b >= double(1 << 30)) return fmt::format("{:.2f} GiB", b / double(1 << 30));
    if (b >= double(1 << 20)) return fmt::format("{:.2f} MiB", b / double(1 << 20));
    return fmt::format("{} bytes", bytes);
}

namespace {

class HostAllocator final : public RawAllocator {
  public:
    explicit HostAllocator(int64_t capacity) : capacity_(capacity) {}
    void* allocate(size_t bytes) override {
        if (int64_t(bytes) > capacity_ - held_) return nullptr;
        void* p = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
        if (p) held_ += int64_t(bytes);
        return p;
    }
    void release(void* ptr, size_t bytes) override {
        std::free(ptr);
        held_ -= int64_t(bytes);
    }
    int64_t free_bytes() const override { return capacity_ - held_; }
    std::string describe() const override { return "host"; }

  private:
    int64_t capacity_;
    int64_t held_ = 0;
};

}  // namespace

std::unique_ptr<RawAllocator> host_allocator(int64_t capacity_bytes) {
    return std::make_unique<HostAllocator>(capacity_bytes);
}

DeviceArena::DeviceArena(std::unique_ptr<RawAllocator> raw) : raw_(std::move(raw)) {}

DeviceBuffer DeviceArena::allocate(size_t bytes, core::MemCategory category,
                                   const std::string& what) {
    const char* cat = core::category_name(category);
    const std::string label = what.empty() ? std::string(cat) : fmt::format("{} ({})", cat, what);
    if (sealed_) {
        throw Error(fmt::format(
            "{}: allocation of {} for {} after the step loop began; a run's device buffers are "
            "allocated once, before its first step",
            raw_->describe(), format_bytes(int64_t(bytes)), label));
    }
    if (bytes == 0) return {};
    void* p = raw_->allocate(bytes);
    std::lock_guard lock(mu_);
    if (!p) {
        throw OutOfMemoryError(fmt::format(
            "{}: out of memory allocating {} for {}; apiary holds {} there already ({} of "
            "parameters, {} of gradients, {} of optimizer state, {} of activations, {} of "
            "buffers) and the device reports {} free; lower train.batch_size or train.seq_len, "
            "or shard with parallel.zero_stage / parallel.tp",
            raw_->describe(), format_bytes(int64_t(bytes)), label,
            format_bytes(stats_.total_current), format_bytes(stats_.current[0]),
            format_bytes(stats_.current[1]), format_bytes(stats_.current[2]),
            format_bytes(stats_.current[3]), format_bytes(stats_.current[4]),
            format_bytes(raw_->free_bytes())));
    }
    const int c = static_cast<int>(category);
    stats_.current[c] += int64_t(bytes);
    stats_.peak[c] = std::max(stats_.peak[c], stats_.current[c]);
    stats_.total_current += int64_t(bytes);
    stats_.total_peak = std::max(stats_.total_peak, stats_.total_current);
    ++allocations_;
    return make_buffer(p, bytes, category);
}

void DeviceArena::release(void* ptr, size_t bytes, core::MemCategory category) {
    raw_->release(ptr, bytes);
    std::lock_guard lock(mu_);
    stats_.current[static_cast<int>(category)] -= int64_t(bytes);
    stats_.total_current -= int64_t(bytes);
}

core::MemStats DeviceArena::stats() const {
    std::lock_guard lock(mu_);
    return stats_;
}

int64_t DeviceArena::allocations() const {
    std::lock_guard lock(mu_);
    return allocations_;
}

}  // namespace apiary::device
