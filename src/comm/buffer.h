#pragma once
// Grow-only scratch memory and the element loops the backends share.

#include <cstddef>
#include <cstdint>

#include "comm/types.h"

namespace apiary::comm {

// Memory that is allocated on first need, grows only, and is reused by every
// later call: a collective never allocates in the steady state. Accounted as
// core::MemCategory::buffers. Not thread-safe: one owner at a time.
class ScratchBuffer {
  public:
    ScratchBuffer() = default;
    ~ScratchBuffer();
    ScratchBuffer(const ScratchBuffer&) = delete;
    ScratchBuffer& operator=(const ScratchBuffer&) = delete;

    // At least `bytes` bytes, 64-byte aligned; contents are not preserved on growth.
    void* ensure(size_t bytes);
    template <typename T>
    T* ensure_as(size_t count) {
        return static_cast<T*>(ensure(count * sizeof(T)));
    }
    size_t capacity() const { return bytes_; }

  private:
    void* data_ = nullptr;
    size_t bytes_ = 0;
};

// Loops over n elements (compiled for the build machine, vectorised).
void bf16_to_f32(const uint16_t* in, float* out, int64_t n);
void f32_to_bf16(const float* in, uint16_t* out, int64_t n);
void add_into(float* acc, const float* x, int64_t n);
void add_bf16_into(float* acc, const uint16_t* x, int64_t n);
void scale_f32(float* x, int64_t n, float s);

}  // namespace apiary::comm
