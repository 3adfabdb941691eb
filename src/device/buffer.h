#pragma once
// Device memory, allocated once per run and accounted like host memory
// (core/allocator.h): per category, with peaks, and an out-of-memory error
// that names the device, the category, the request and what is already held.
// After seal() (the step loop has begun) any further allocation is a bug and
// throws: the flat parameter, gradient, optimizer and activation buffers are
// made before the first step, as on the CPU.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "core/allocator.h"

namespace apiary::device {

// Where the bytes come from: cudaMalloc on a GPU; plain host memory with a
// capacity for tests (and the CPU). Returns nullptr when it cannot.
class RawAllocator {
  public:
    virtual ~RawAllocator() = default;
    virtual void* allocate(size_t bytes) = 0;
    virtual void release(void* ptr, size_t bytes) = 0;
    // Bytes the device could still give (cudaMemGetInfo), for messages.
    virtual int64_t free_bytes() const = 0;
    virtual std::string describe() const = 0;  // "cuda:0 (NVIDIA H200)", "host"
};

// Host memory, at most capacity_bytes at once (tests stand in for a device
// with a small memory this way).
std::unique_ptr<RawAllocator> host_allocator(int64_t capacity_bytes);
// cudaMalloc on `device` (throws DeviceError on a build without CUDA).
std::unique_ptr<RawAllocator> cuda_allocator(int device);

class DeviceArena;

// A block of device memory; freed (and un-accounted) when destroyed. Its
// members are inline and reach the arena through virtual calls only, so the
// CUDA module (cuda_backend.h) can hold buffers without linking this layer.
class DeviceBuffer {
  public:
    DeviceBuffer() = default;
    ~DeviceBuffer() { reset(); }
    DeviceBuffer(DeviceBuffer&& o) noexcept
        : arena_(std::exchange(o.arena_, nullptr)),
          ptr_(std::exchange(o.ptr_, nullptr)),
          bytes_(std::exchange(o.bytes_, 0)),
          category_(o.category_) {}
    DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
        if (this != &o) {
            reset();
            arena_ = std::exchange(o.arena_, nullptr);
            ptr_ = std::exchange(o.ptr_, nullptr);
            bytes_ = std::exchange(o.bytes_, 0);
            category_ = o.category_;
        }
        return *this;
    }
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;

    void* data() const { return ptr_; }
    float* f32() const { return static_cast<float*>(ptr_); }
    size_t bytes() const { return bytes_; }
    core::MemCategory category() const { return category_; }

  private:
    friend class DeviceArena;
    DeviceBuffer(DeviceArena* arena, void* ptr, size_t bytes, core::MemCategory c)
        : arena_(arena), ptr_(ptr), bytes_(bytes), category_(c) {}
    inline void reset();
    DeviceArena* arena_ = nullptr;
    void* ptr_ = nullptr;
    size_t bytes_ = 0;
    core::MemCategory category_ = core::MemCategory::buffers;
};

class DeviceArena {
  public:
    explicit DeviceArena(std::unique_ptr<RawAllocator> raw);
    virtual ~DeviceArena() = default;
    // Throws OutOfMemoryError ("cuda:0: 2.0 GiB of activations (what) ...").
    // Zero bytes gives an empty buffer.
    virtual DeviceBuffer allocate(size_t bytes, core::MemCategory category,
                                  const std::string& what = "");
    // From now on allocate() throws: the buffers of a run are made before its
    // first step.
    void seal() { sealed_ = true; }
    bool sealed() const { return sealed_; }
    core::MemStats stats() const;
    int64_t allocations() const;
    const RawAllocator& raw() const { return *raw_; }

  protected:
    friend class DeviceBuffer;
    virtual void release(void* ptr, size_t bytes, core::MemCategory c);
    DeviceBuffer make_buffer(void* ptr, size_t bytes, core::MemCategory c) {
        return DeviceBuffer(this, ptr, bytes, c);
    }

  private:
    std::unique_ptr<RawAllocator> raw_;
    mutable std::mutex mu_;
    core::MemStats stats_;
    int64_t allocations_ = 0;
    bool sealed_ = false;
};

void DeviceBuffer::reset() {
    if (arena_ && ptr_) arena_->release(ptr_, bytes_, category_);
    arena_ = nullptr;
    ptr_ = nullptr;
    bytes_ = 0;
}

// "1.50 GiB" for messages.
std::string format_bytes(int64_t bytes);

}  // namespace apiary::device
