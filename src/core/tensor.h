#pragma once
// A contiguous, owning tensor of f32, bf16 or f16 storage, allocated through
// the accounting allocator. Kernels take raw pointers and shape letters
// (llm.c style); Tensor only owns and describes memory.

#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <vector>

#include "core/allocator.h"

namespace apiary::core {

// i64 and f64 are for counts and sums that travel between ranks (token
// counts, loss sums, squared norms), not for tensors of the model.
enum class DType : uint8_t { f32, bf16, f16, i64, f64 };
size_t dtype_size(DType dt);
const char* dtype_name(DType dt);

class Tensor {
  public:
    Tensor() = default;
    Tensor(std::vector<int64_t> shape, DType dtype, MemCategory category);
    ~Tensor();
    Tensor(Tensor&& other) noexcept;
    Tensor& operator=(Tensor&& other) noexcept;
    Tensor(const Tensor&) = delete;
    Tensor& operator=(const Tensor&) = delete;

    template <typename T>
    T* data() {
        return static_cast<T*>(data_);
    }
    template <typename T>
    const T* data() const {
        return static_cast<const T*>(data_);
    }
    float* f32() { return data<float>(); }
    const float* f32() const { return data<float>(); }

    const std::vector<int64_t>& shape() const { return shape_; }
    int64_t numel() const { return numel_; }
    size_t nbytes() const { return size_t(numel_) * dtype_size(dtype_); }
    DType dtype() const { return dtype_; }
    MemCategory category() const { return category_; }
    bool empty() const { return data_ == nullptr; }
    void zero();
    std::string shape_string() const;

  private:
    void release();
    void* data_ = nullptr;
    std::vector<int64_t> shape_;
    int64_t numel_ = 0;
    DType dtype_ = DType::f32;
    MemCategory category_ = MemCategory::buffers;
};

// bf16: the upper 16 bits of an f32, rounded to nearest even.
uint16_t f32_to_bf16(float x);
float bf16_to_f32(uint16_t x);
// IEEE half precision, round to nearest even, with overflow to inf.
uint16_t f32_to_f16(float x);
float f16_to_f32(uint16_t x);

}  // namespace apiary::core
