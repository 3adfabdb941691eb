#include "core/tensor.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <cstring>
#include <utility>

#include "core/error.h"

namespace apiary::core {

size_t dtype_size(DType dt) {
    switch (dt) {
        case DType::f32:
            return 4;
        case DType::bf16:
        case DType::f16:
            return 2;
        case DType::i64:
        case DType::f64:
            return 8;
    }
    return 0;
}

const char* dtype_name(DType dt) {
    switch (dt) {
        case DType::f32:
            return "f32";
        case DType::bf16:
            return "bf16";
        case DType::f16:
            return "f16";
        case DType::i64:
            return "i64";
        case DType::f64:
            return "f64";
    }
    return "?";
}

Tensor::Tensor(std::vector<int64_t> shape, DType dtype, MemCategory category)
    : shape_(std::move(shape)), dtype_(dtype), category_(category) {
    numel_ = 1;
    for (int64_t d : shape_) {
        APIARY_CHECK(d >= 0, "negative tensor dimension in shape {}", shape_string());
        numel_ *= d;
    }
    data_ = mem_allocate(nbytes(), category_,
                         fmt::format("{} tensor {}", dtype_name(dtype_), shape_string()));
}

Tensor::~Tensor() { release(); }

void Tensor::release() {
    if (data_) mem_release(data_, nbytes(), category_);
    data_ = nullptr;
}

Tensor::Tensor(Tensor&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)),
      shape_(std::move(o.shape_)),
      numel_(std::exchange(o.numel_, 0)),
      dtype_(o.dtype_),
      category_(o.category_) {}

Tensor& Tensor::operator=(Tensor&& o) noexcept {
    if (this != &o) {
        release();
        data_ = std::exchange(o.data_, nullptr);
        shape_ = std::move(o.shape_);
        numel_ = std::exchange(o.numel_, 0);
        dtype_ = o.dtype_;
        category_ = o.category_;
    }
    return *this;
}

void Tensor::zero() {
    if (data_) std::memset(data_, 0, nbytes());
}

std::string Tensor::shape_string() const { return fmt::format("({})", fmt::join(shape_, ", ")); }

uint16_t f32_to_bf16(float x) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return uint16_t(u >> 16);
}

float bf16_to_f32(uint16_t x) {
    const uint32_t u = uint32_t(x) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

uint16_t f32_to_f16(float x) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    const uint32_t sign = (u >> 16) & 0x8000u;
    u &= 0x7fffffffu;
    if (u > 0x7f800000u) return uint16_t(sign | 0x7e00u);   // NaN
    if (u >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds to >= 65536: inf
    if (u < 0x38800000u) {                                  // subnormal or zero in f16
        const float f = std::fabs(x) * 16777216.0f;         // scale by 2^24
        return uint16_t(sign | uint32_t(std::nearbyint(f)));
    }
    const uint32_t mant_round = u + 0x0fffu + ((u >> 13) & 1u);
    return uint16_t(sign | ((mant_round - 0x38000000u) >> 13));
}

float f16_to_f32(uint16_t h) {
    const uint32_t sign = uint32_t(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu;
    const uint32_t mant = h & 0x3ffu;
    float f;
    if (exp == 0) {
        f = std::ldexp(float(mant), -24);
        uint32_t u;
        std::memcpy(&u, &f, 4);
        u |= sign;
        std::memcpy(&f, &u, 4);
        return f;
    }
    uint32_t u;
    if (exp == 31) {
        u = sign | 0x7f800000u | (mant << 13);
    } else {
        u = sign | ((exp + 112) << 23) | (mant << 13);
    }
    std::memcpy(&f, &u, 4);
    return f;
}

}  // namespace apiary::core
