// The CUDA side of the device layer, built into libapiary_cuda.so with
// kernels/cuda/ (cuda_backend.h): the probe, cudaMalloc accounting and
// CudaOps (kernels/cuda/ on one stream per rank). Host C++ over the CUDA
// runtime; the kernels themselves are in kernels/cuda/*.cu.

#include <cuda_runtime.h>
#include <fmt/format.h>

#include "core/error.h"
#include "device/context.h"
#include "device/cuda_backend.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/cuda_kernels.h"

namespace apiary::device {

namespace {

CudaProbe probe() {
    CudaProbe p;
    p.built = true;
    const cudaError_t e = cudaGetDeviceCount(&p.count);
    if (e != cudaSuccess) {
        p.count = 0;
        p.error = fmt::format("{} ({})", cudaGetErrorName(e), cudaGetErrorString(e));
        cudaGetLastError();  // clear the sticky error for a later, legitimate call
    }
    return p;
}

class CudaAllocator final : public RawAllocator {
  public:
    explicit CudaAllocator(int device) : device_(device) {
        APIARY_CUDA_CALL(cudaSetDevice(device));
        cudaDeviceProp prop{};
        APIARY_CUDA_CALL(cudaGetDeviceProperties(&prop, device));
        name_ = fmt::format("cuda:{} ({})", device, prop.name);
    }
    void* allocate(size_t bytes) override {
        void* p = nullptr;
        if (cudaSetDevice(device_) != cudaSuccess || cudaMalloc(&p, bytes) != cudaSuccess) {
            cudaGetLastError();  // an out-of-memory error is not sticky; clear it
            return nullptr;
        }
        return p;
    }
    void release(void* ptr, size_t) override { cudaFree(ptr); }
    int64_t free_bytes() const override {
        size_t free = 0, total = 0;
        if (cudaMemGetInfo(&free, &total) != cudaSuccess) return -1;
        return int64_t(free);
    }
    std::string describe() const override { return name_; }

  private:
    int device_;
    std::string name_;
};

namespace kc = apiary::kernels::cuda;

class CudaOps final : public Ops {
  public:
    CudaOps(DeviceArena& arena, int device) {
        APIARY_CUDA_CALL(cudaSetDevice(device));
        APIARY_CUDA_CALL(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
        gemm_ = std::make_unique<kc::GemmContext>(stream_);
        partials_ = arena.allocate(size_t(kc::sum_squares_scratch()) * sizeof(double),
                                   core::MemCategory::buffers, "sum_squares partials");
        stats_ = arena.allocate(size_t(kc::lm_head_stats_bytes()), core::MemCategory::buffers,
                                "loss statistics");
    }
    ~CudaOps() override {
        gemm_.reset();
        cudaStreamSynchronize(stream_);
        cudaStreamDestroy(stream_);
    }

    std::string name() const override { return "cuda"; }
    void to_device(void* dst, const void* src, size_t bytes) override {
        APIARY_CUDA_CALL(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
        APIARY_CUDA_CALL(cudaStreamSynchronize(stream_));  // src may be freed after return
    }
    void to_host(void* dst, const void* src, size_t bytes) override {
        APIARY_CUDA_CALL(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
        APIARY_CUDA_CALL(cudaStreamSynchronize(stream_));
    }
    void fill_zero(void* dst, size_t bytes) override {
        APIARY_CUDA_CALL(cudaMemsetAsync(dst, 0, bytes, stream_));
    }
    void synchronize() override { APIARY_CUDA_CALL(cudaStreamSynchronize(stream_)); }
    void set_allow_tf32(bool on) override { gemm_->set_allow_tf32(on); }

    void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
              const float* B, int64_t ldb, float beta, float* C, int64_t ldc) override {
        kc::gemm(*gemm_, ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc);
    }
    void gemm_bf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const uint16_t* A,
                   int64_t lda, const uint16_t* B, int64_t ldb, float beta, float* C,
                   int64_t ldc) override {
        kc::gemm_bf16(*gemm_, ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc);
    }
    void linear_forward(float* y, const float* x, const float* w, const float* b, int64_t N,
                        int64_t IN, int64_t OUT) override {
        kc::linear_forward(*gemm_, y, x, w, b, N, IN, OUT);
    }
    void linear_backward(float* dx, float* dw, float* db, const float* dy, const float* x,
                         const float* w, int64_t N, int64_t IN, int64_t OUT) override {
        kc::linear_backward(*gemm_, dx, dw, db, dy, x, w, N, IN, OUT);
    }
    void linear_forward_bf16(float* y, const uint16_t* x, const uint16_t* w, const float* b,
                             int64_t N, int64_t IN, int64_t OUT) override {
        kc::linear_forward_bf16(*gemm_, y, x, w, b, N, IN, OUT);
    }
    void linear_backward_bf16(float* dx, float* dw, const uint16_t* dy, const uint16_t* x,
                              const uint16_t* w, int64_t N, int64_t IN, int64_t OUT) override {
        kc::linear_backward_bf16(*gemm_, dx, dw, dy, x, w, N, IN, OUT);
    }
    void linear_bias_backward(float* dbias, const float* dy, int64_t N, int64_t OUT) override {
        kc::linear_bias_backward(stream_, dbias, dy, N, OUT);
    }
    void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                           int64_t B, int64_t T, int64_t C) override {
        kc::embedding_forward(stream_, out, tokens, wte, wpe, B, T, C);
    }
    void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                            int64_t B, int64_t T, int64_t C) override {
        kc::embedding_backward(stream_, dwte, dwpe, dout, tokens, B, T, C);
    }
    void layernorm_forward(float* out, float* mean, float* rstd, const float* x, const float* w,
                           const float* b, int64_t N, int64_t C, float eps) override {
        kc::layernorm_forward(stream_, out, mean, rstd, x, w, b, N, C, eps);
    }
    void layernorm_backward(float* dx, float* dw, float* db, const float* dout, const float* x,
                            const float* w, const float* mean, const float* rstd, int64_t N,
                            int64_t C) override {
        kc::layernorm_backward(stream_, dx, dw, db, dout, x, w, mean, rstd, N, C);
    }
    void rmsnorm_forward(float* out, float* rstd, const float* x, const float* w, int64_t N,
                         int64_t C, float eps) override {
        kc::rmsnorm_forward(stream_, out, rstd, x, w, N, C, eps);
    }
    void rmsnorm_backward(float* dx, float* dw, const float* dout, const float* x, const float* w,
                          const float* rstd, int64_t N, int64_t C) override {
        kc::rmsnorm_backward(stream_, dx, dw, dout, x, w, rstd, N, C);
    }
    void gelu_forward(float* out, const float* x, int64_t n) override {
        kc::gelu_forward(stream_, out, x, n);
    }
    void gelu_backward(float* dx, const float* x, const float* dout, int64_t n) override {
        kc::gelu_backward(stream_, dx, x, dout, n);
    }
    void swiglu_forward(float* out, const float* h, int64_t N, int64_t F) override {
        kc::swiglu_forward(stream_, out, h, N, F);
    }
    void swiglu_backward(float* dh, const float* dout, const float* h, int64_t N,
                         int64_t F) override {
        kc::swiglu_backward(stream_, dh, dout, h, N, F);
    }
    void rope_apply(float* x, const float* cs, const float* sn, int64_t B, int64_t T,
                    int64_t row_stride, int64_t offset, int64_t heads, int64_t HS,
                    bool inverse) override {
        kc::rope_apply(stream_, x, cs, sn, B, T, row_stride, offset, heads, HS, inverse);
    }
    void attention_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T,
                           int64_t NH, int64_t KVH, int64_t HS) override {
        kc::attention_forward(stream_, out, lse, qkv, B, T, NH, KVH, HS);
    }
    int64_t attention_scratch_floats(int64_t B, int64_t T, int64_t NH) const override {
        return kc::attention_backward_scratch(B, T, NH);
    }
    void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                            const float* lse, int64_t B, int64_t T, int64_t NH, int64_t KVH,
                            int64_t HS, float* scratch) override {
        kc::attention_backward(stream_, dqkv, dout, qkv, out, lse, B, T, NH, KVH, HS, scratch);
    }
    int64_t lm_head_scratch_floats(int64_t N, int64_t V) const override {
        return kc::lm_head_scratch_floats(N, V);
    }
    double lm_head_cross_entropy(const float* h, const float* W, const int32_t* targets, int64_t N,
                                 int64_t C, int64_t V, float grad_scale, float* dh, float* dW,
                                 int64_t* valid, float* scratch, int64_t scratch_floats) override {
        return kc::lm_head_cross_entropy(*gemm_, h, W, targets, N, C, V, grad_scale, dh, dW, valid,
                                         scratch, scratch_floats, stats_.data());
    }
    void adamw_update(float* p, const float* g, float* m, float* v, int64_t n, float lr, float b1,
                      float b2, float eps, float wd, int64_t t, float gs) override {
        kc::adamw_update(stream_, p, g, m, v, n, lr, b1, b2, eps, wd, t, gs);
    }
    void adamw_update_bf16_copy(float* p, uint16_t* p16, const float* g, float* m, float* v,
                                int64_t n, float lr, float b1, float b2, float eps, float wd,
                                int64_t t, float gs) override {
        kc::adamw_update_bf16_copy(stream_, p, p16, g, m, v, n, lr, b1, b2, eps, wd, t, gs);
    }
    double sum_squares(const float* x, int64_t n) override {
        return kc::sum_squares(stream_, x, n, static_cast<double*>(partials_.data()));
    }
    void scale_inplace(float* x, int64_t n, float s) override {
        kc::scale_inplace(stream_, x, n, s);
    }
    void add_inplace(float* y, const float* x, int64_t n) override {
        kc::add_inplace(stream_, y, x, n);
    }
    void to_bf16(uint16_t* dst, const float* src, int64_t n) override {
        kc::to_bf16(stream_, dst, src, n);
    }
    void copy_round_to_f16(float* dst, const float* src, int64_t n) override {
        kc::copy_round_to_f16(stream_, dst, src, n);
    }

  private:
    cudaStream_t stream_ = nullptr;
    std::unique_ptr<kc::GemmContext> gemm_;
    DeviceBuffer partials_, stats_;
};

std::unique_ptr<RawAllocator> make_allocator(int device) {
    return std::make_unique<CudaAllocator>(device);
}

std::unique_ptr<Ops> make_ops(DeviceArena& arena, int device) {
    return std::make_unique<CudaOps>(arena, device);
}

}  // namespace
}  // namespace apiary::device

extern "C" __attribute__((visibility("default"))) const apiary::device::CudaBackend*
apiary_cuda_backend_v1() {
    static const apiary::device::CudaBackend backend{
        apiary::device::kCudaBackendAbi, &apiary::device::probe, &apiary::device::make_allocator,
        &apiary::device::make_ops};
    return &backend;
}
