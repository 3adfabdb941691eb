#include "comm/buffer.h"

#include <algorithm>
#include <cstring>

#include "core/allocator.h"

namespace apiary::comm {

ScratchBuffer::~ScratchBuffer() {
    if (data_) core::mem_release(data_, bytes_, core::MemCategory::buffers);
}

void* ScratchBuffer::ensure(size_t bytes) {
    if (bytes <= bytes_) return data_;
    if (data_) core::mem_release(data_, bytes_, core::MemCategory::buffers);
    data_ = nullptr;
    // The first allocation is what was asked (a reservation is exact); later
    // ones at least double, so that a slowly growing caller does not
    // reallocate every call.
    size_t cap = bytes_ == 0 ? bytes : std::max(bytes, 2 * bytes_);
    cap = (cap + 4095) / 4096 * 4096;
    data_ = core::mem_allocate(cap, core::MemCategory::buffers);
    bytes_ = cap;
    return data_;
}

// bf16 is the upper half of an f32; conversion down rounds to nearest even.
// NaN payloads are kept quiet rather than rounded into infinity.
void bf16_to_f32(const uint16_t* in, float* out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        const uint32_t bits = uint32_t(in[i]) << 16;
        std::memcpy(&out[i], &bits, 4);
    }
}

void f32_to_bf16(const float* in, uint16_t* out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        uint32_t bits;
        std::memcpy(&bits, &in[i], 4);
        if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0) {
            out[i] = uint16_t((bits >> 16) | 0x40);
        } else {
            bits += 0x7fffu + ((bits >> 16) & 1u);
            out[i] = uint16_t(bits >> 16);
        }
    }
}

void add_into(float* acc, const float* x, int64_t n) {
    for (int64_t i = 0; i < n; ++i) acc[i] += x[i];
}

void add_bf16_into(float* acc, const uint16_t* x, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        const uint32_t bits = uint32_t(x[i]) << 16;
        float v;
        std::memcpy(&v, &bits, 4);
        acc[i] += v;
    }
}

void scale_f32(float* x, int64_t n, float s) {
    for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

}  // namespace apiary::comm
