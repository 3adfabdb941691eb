// Ops over the CPU kernels: every call goes straight to kernels.h.

#include <cstring>

#include "device/ops.h"
#include "kernels/kernels.h"

namespace apiary::device {

namespace {

namespace k = apiary::kernels;

class CpuOps final : public Ops {
  public:
    std::string name() const override { return "cpu"; }
    void to_device(void* dst, const void* src, size_t bytes) override {
        std::memcpy(dst, src, bytes);
    }
    void to_host(void* dst, const void* src, size_t bytes) override {
        std::memcpy(dst, src, bytes);
    }
    void fill_zero(void* dst, size_t bytes) override { std::memset(dst, 0, bytes); }
    void synchronize() override {}
    void set_allow_tf32(bool) override {}

    void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
              const float* B, int64_t ldb, float beta, float* C, int64_t ldc) override {
        k::gemm(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc);
    }
    void gemm_bf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const uint16_t* A,
                   int64_t lda, const uint16_t* B, int64_t ldb, float beta, float* C,
                   int64_t ldc) override {
        k::gemm_bf16(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc);
    }
    void linear_forward(float* y, const float* x, const float* w, const float* b, int64_t N,
                        int64_t IN, int64_t OUT) override {
        k::linear_forward(y, x, w, b, N, IN, OUT);
    }
    void linear_backward(float* dx, float* dw, float* db, const float* dy, const float* x,
                         const float* w, int64_t N, int64_t IN, int64_t OUT) override {
        k::linear_backward(dx, dw, db, dy, x, w, N, IN, OUT);
    }
    void linear_forward_bf16(float* y, const uint16_t* x, const uint16_t* w, const float* b,
                             int64_t N, int64_t IN, int64_t OUT) override {
        k::linear_forward_bf16(y, x, w, b, N, IN, OUT);
    }
    void linear_backward_bf16(float* dx, float* dw, const uint16_t* dy, const uint16_t* x,
                              const uint16_t* w, int64_t N, int64_t IN, int64_t OUT) override {
        k::linear_backward_bf16(dx, dw, dy, x, w, N, IN, OUT);
    }
    void linear_bias_backward(float* dbias, const float* dy, int64_t N, int64_t OUT) override {
        k::linear_bias_backward(dbias, dy, N, OUT);
    }
    void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                           int64_t B, int64_t T, int64_t C) override {
        k::embedding_forward(out, tokens, wte, wpe, B, T, C);
    }
    void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                            int64_t B, int64_t T, int64_t C) override {
        k::embedding_backward(dwte, dwpe, dout, tokens, B, T, C);
    }
    void layernorm_forward(float* out, float* mean, float* rstd, const float* x, const float* w,
                           const float* b, int64_t N, int64_t C, float eps) override {
        k::layernorm_forward(out, mean, rstd, x, w, b, N, C, eps);
    }
    void layernorm_backward(float* dx, float* dw, float* db, const float* dout, const float* x,
                            const float* w, const float* mean, const float* rstd, int64_t N,
                            int64_t C) override {
        k::layernorm_backward(dx, dw, db, dout, x, w, mean, rstd, N, C);
    }
    void rmsnorm_forward(float* out, float* rstd, const float* x, const float* w, int64_t N,
                         int64_t C, float eps) override {
        k::rmsnorm_forward(out, rstd, x, w, N, C, eps);
    }
    void rmsnorm_backward(float* dx, float* dw, const float* dout, const float* x, const float* w,
                          const float* rstd, int64_t N, int64_t C) override {
        k::rmsnorm_backward(dx, dw, dout, x, w, rstd, N, C);
    }
    void gelu_forward(float* out, const float* x, int64_t n) override {
        k::gelu_forward(out, x, n);
    }
    void gelu_backward(float* dx, const float* x, const float* dout, int64_t n) override {
        k::gelu_backward(dx, x, dout, n);
    }
    void swiglu_forward(float* out, const float* h, int64_t N, int64_t F) override {
        k::swiglu_forward(out, h, N, F);
    }
    void swiglu_backward(float* dh, const float* dout, const float* h, int64_t N,
                         int64_t F) override {
        k::swiglu_backward(dh, dout, h, N, F);
    }
    void rope_apply(float* x, const float* cs, const float* sn, int64_t B, int64_t T,
                    int64_t row_stride, int64_t offset, int64_t heads, int64_t HS,
                    bool inverse) override {
        k::rope_apply(x, cs, sn, B, T, row_stride, offset, heads, HS, inverse);
    }
    void attention_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T,
                           int64_t NH, int64_t KVH, int64_t HS) override {
        k::attention_forward(out, lse, qkv, B, T, NH, KVH, HS);
    }
    int64_t attention_scratch_floats(int64_t, int64_t, int64_t) const override { return 0; }
    void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                            const float* lse, int64_t B, int64_t T, int64_t NH, int64_t KVH,
                            int64_t HS, float*) override {
        k::attention_backward(dqkv, dout, qkv, out, lse, B, T, NH, KVH, HS);
    }
    int64_t lm_head_scratch_floats(int64_t N, int64_t V) const override {
        return k::lm_head_scratch_floats(N, V);
    }
    double lm_head_cross_entropy(const float* h, const float* W, const int32_t* targets, int64_t N,
                                 int64_t C, int64_t V, float grad_scale, float* dh, float* dW,
                                 int64_t* valid, float* scratch, int64_t scratch_floats) override {
        return k::lm_head_cross_entropy(h, W, targets, N, C, V, grad_scale, dh, dW, valid, scratch,
                                        scratch_floats);
    }
    void adamw_update(float* p, const float* g, float* m, float* v, int64_t n, float lr, float b1,
                      float b2, float eps, float wd, int64_t t, float gs) override {
        k::adamw_update(p, g, m, v, n, lr, b1, b2, eps, wd, t, gs);
    }
    void adamw_update_bf16_copy(float* p, uint16_t* p16, const float* g, float* m, float* v,
                                int64_t n, float lr, float b1, float b2, float eps, float wd,
                                int64_t t, float gs) override {
        k::adamw_update_bf16_copy(p, p16, g, m, v, n, lr, b1, b2, eps, wd, t, gs);
    }
    double sum_squares(const float* x, int64_t n) override { return k::sum_squares(x, n); }
    void scale_inplace(float* x, int64_t n, float s) override { k::scale_inplace(x, n, s); }
    void add_inplace(float* y, const float* x, int64_t n) override { k::add_inplace(y, x, n); }
    void to_bf16(uint16_t* dst, const float* src, int64_t n) override { k::to_bf16(dst, src, n); }
    void copy_round_to_f16(float* dst, const float* src, int64_t n) override {
        k::copy_round_to_f16(dst, src, n);
    }
};

}  // namespace

std::unique_ptr<Ops> cpu_ops() { return std::make_unique<CpuOps>(); }

}  // namespace apiary::device
