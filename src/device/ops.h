#pragma once
// The kernels.h operations behind one interface, so that code written once
// runs on the device a run chose (train.device): CpuOps calls the CPU kernels
// (kernels/kernels.h) unchanged; CudaOps calls kernels/cuda/ on the rank's
// stream. Same shapes and write-versus-add conventions as kernels.h; every
// pointer is memory of the ops' device (DeviceContext::arena()). Calls are
// queued in order on the device; a call that returns a value to the host
// (a loss, a norm) waits for the work before it.

#include <cstdint>
#include <memory>
#include <string>

namespace apiary::device {

class Ops {
  public:
    virtual ~Ops() = default;
    virtual std::string name() const = 0;  // "cpu", "cuda"

    // Memory of this device <-> host; synchronize() waits for queued work.
    virtual void to_device(void* dst, const void* host_src, size_t bytes) = 0;
    virtual void to_host(void* host_dst, const void* src, size_t bytes) = 0;
    virtual void fill_zero(void* dst, size_t bytes) = 0;
    virtual void synchronize() = 0;
    // fp32 GEMMs may use tf32 tensor cores (cuda; the CPU ignores it).
    virtual void set_allow_tf32(bool on) = 0;

    virtual void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* A,
                      int64_t lda, const float* B, int64_t ldb, float beta, float* C,
                      int64_t ldc) = 0;
    virtual void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                           const uint16_t* A, int64_t lda, const uint16_t* B, int64_t ldb,
                           float beta, float* C, int64_t ldc) = 0;
    virtual void linear_forward(float* y, const float* x, const float* weight, const float* bias,
                                int64_t N, int64_t IN, int64_t OUT) = 0;
    virtual void linear_backward(float* dx, float* dweight, float* dbias, const float* dy,
                                 const float* x, const float* weight, int64_t N, int64_t IN,
                                 int64_t OUT) = 0;
    virtual void linear_forward_bf16(float* y, const uint16_t* x, const uint16_t* weight,
                                     const float* bias, int64_t N, int64_t IN, int64_t OUT) = 0;
    virtual void linear_backward_bf16(float* dx, float* dweight, const uint16_t* dy,
                                      const uint16_t* x, const uint16_t* weight, int64_t N,
                                      int64_t IN, int64_t OUT) = 0;

    // dbias (OUT) += column sums of dy (N, OUT): the bias gradient of a bf16
    // linear layer, whose backward takes dy in bf16.
    virtual void linear_bias_backward(float* dbias, const float* dy, int64_t N, int64_t OUT) = 0;

    virtual void embedding_forward(float* out, const int32_t* tokens, const float* wte,
                                   const float* wpe, int64_t B, int64_t T, int64_t C) = 0;
    virtual void embedding_backward(float* dwte, float* dwpe, const float* dout,
                                    const int32_t* tokens, int64_t B, int64_t T, int64_t C) = 0;
    virtual void layernorm_forward(float* out, float* mean, float* rstd, const float* x,
                                   const float* weight, const float* bias, int64_t N, int64_t C,
                                   float eps) = 0;
    virtual void layernorm_backward(float* dx, float* dweight, float* dbias, const float* dout,
                                    const float* x, const float* weight, const float* mean,
                                    const float* rstd, int64_t N, int64_t C) = 0;
    virtual void rmsnorm_forward(float* out, float* rstd, const float* x, const float* weight,
                                 int64_t N, int64_t C, float eps) = 0;
    virtual void rmsnorm_backward(float* dx, float* dweight, const float* dout, const float* x,
                                  const float* weight, const float* rstd, int64_t N, int64_t C) = 0;
    virtual void gelu_forward(float* out, const float* x, int64_t n) = 0;
    virtual void gelu_backward(float* dx, const float* x, const float* dout, int64_t n) = 0;
    virtual void swiglu_forward(float* out, const float* h, int64_t N, int64_t F) = 0;
    virtual void swiglu_backward(float* dh, const float* dout, const float* h, int64_t N,
                                 int64_t F) = 0;
    virtual void rope_apply(float* x, const float* cos_table, const float* sin_table, int64_t B,
                            int64_t T, int64_t row_stride, int64_t offset, int64_t heads,
                            int64_t HS, bool inverse) = 0;

    virtual void attention_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T,
                                   int64_t NH, int64_t KVH, int64_t HS) = 0;
    // scratch: attention_scratch_floats(B, T, NH) floats of this device.
    virtual int64_t attention_scratch_floats(int64_t B, int64_t T, int64_t NH) const = 0;
    virtual void attention_backward(float* dqkv, const float* dout, const float* qkv,
                                    const float* out, const float* lse, int64_t B, int64_t T,
                                    int64_t NH, int64_t KVH, int64_t HS, float* scratch) = 0;

    virtual int64_t lm_head_scratch_floats(int64_t N, int64_t V) const = 0;
    virtual double lm_head_cross_entropy(const float* h, const float* W, const int32_t* targets,
                                         int64_t N, int64_t C, int64_t V, float grad_scale,
                                         float* dh, float* dW, int64_t* valid, float* scratch,
                                         int64_t scratch_floats) = 0;

    virtual void adamw_update(float* param, const float* grad, float* m, float* v, int64_t n,
                              float lr, float beta1, float beta2, float eps, float weight_decay,
                              int64_t t, float grad_scale) = 0;
    virtual void adamw_update_bf16_copy(float* param, uint16_t* param_bf16, const float* grad,
                                        float* m, float* v, int64_t n, float lr, float beta1,
                                        float beta2, float eps, float weight_decay, int64_t t,
                                        float grad_scale) = 0;
    virtual double sum_squares(const float* x, int64_t n) = 0;
    // Loss scaling: unscale a gradient, put values on the fp16 grid.
    virtual void scale_inplace(float* x, int64_t n, float s) = 0;
    virtual void add_inplace(float* y, const float* x, int64_t n) = 0;
    virtual void to_bf16(uint16_t* dst, const float* src, int64_t n) = 0;
    virtual void copy_round_to_f16(float* dst, const float* src, int64_t n) = 0;
};

// The CPU kernels, unchanged, through the interface.
std::unique_ptr<Ops> cpu_ops();

}  // namespace apiary::device
