#pragma once
// The kernels.h operations on an NVIDIA GPU (kernels/cuda/, built when
// APIARY_CUDA finds the toolkit). Same shapes, same write-versus-add
// conventions and the same formulas as the CPU kernels; every pointer is
// device memory and every call is queued on `stream` (nothing here
// synchronises, except where a result is returned to the host).
//
// No CUDA code in this header (STYLE.md): the stream is CUDA's opaque handle,
// declared here, so a file that includes this needs no CUDA headers.
//
// Shape letters as in kernels.h: B batch, T sequence, C channels, V vocabulary,
// NH heads, KVH key/value heads, HS head size, F MLP hidden width, N = B*T.

#include <cstdint>
#include <memory>

struct CUstream_st;

namespace apiary::kernels::cuda {

using Stream = CUstream_st*;

// ---- matrix multiply (cuBLASLt) ----

// One cuBLASLt handle, its workspace and the matmul plans made so far, for
// one stream. Not thread-safe: one per rank.
class GemmContext {
  public:
    // workspace_bytes of device memory are allocated here, once.
    GemmContext(Stream stream, int64_t workspace_bytes = int64_t(32) << 20);
    ~GemmContext();
    GemmContext(const GemmContext&) = delete;
    GemmContext& operator=(const GemmContext&) = delete;
    Stream stream() const;
    // fp32 GEMMs use tf32 tensor cores when true (10-bit mantissa products,
    // fp32 accumulation); plain fp32 when false (the default: the CPU
    // reference tests' tolerances assume fp32 products).
    void set_allow_tf32(bool on);
    struct Impl;
    Impl* impl_ptr() { return impl_.get(); }

  private:
    std::unique_ptr<Impl> impl_;
};

enum class GemmType : int { f32, bf16 };

// C (M, N) = op(A) (M, K) op(B) (K, N) + beta C, row-major with leading
// dimensions, as kernels::gemm. A and B of type `ab` (f32 or bf16), C of type
// `c` (f32, or bf16 with beta = 0); fp32 accumulation always.
void gemm_ex(GemmContext& ctx, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
             const void* A, int64_t lda, const void* B, int64_t ldb, float beta, void* C,
             int64_t ldc, GemmType ab, GemmType c);
void gemm(GemmContext& ctx, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
          const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
          int64_t ldc);
void gemm_bf16(GemmContext& ctx, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
               const uint16_t* A, int64_t lda, const uint16_t* B, int64_t ldb, float beta, float* C,
               int64_t ldc);
// y (N, OUT) = x (N, IN) W^T (W (OUT, IN)) + bias (OUT, or null).
void linear_forward(GemmContext& ctx, float* y, const float* x, const float* weight,
                    const float* bias, int64_t N, int64_t IN, int64_t OUT);
// dx (N, IN) = dy W (written; may be null); dweight += dy^T x; dbias += column sums.
void linear_backward(GemmContext& ctx, float* dx, float* dweight, float* dbias, const float* dy,
                     const float* x, const float* weight, int64_t N, int64_t IN, int64_t OUT);
// bf16 operands, fp32 results, as kernels::linear_forward_bf16 / _backward_bf16.
void linear_forward_bf16(GemmContext& ctx, float* y, const uint16_t* x, const uint16_t* weight,
                         const float* bias, int64_t N, int64_t IN, int64_t OUT);
void linear_backward_bf16(GemmContext& ctx, float* dx, float* dweight, const uint16_t* dy,
                          const uint16_t* x, const uint16_t* weight, int64_t N, int64_t IN,
                          int64_t OUT);

// ---- elementwise, normalisation, embedding (elementwise.cu) ----

void embedding_forward(Stream s, float* out, const int32_t* tokens, const float* wte,
                       const float* wpe, int64_t B, int64_t T, int64_t C);
void embedding_backward(Stream s, float* dwte, float* dwpe, const float* dout,
                        const int32_t* tokens, int64_t B, int64_t T, int64_t C);
void layernorm_forward(Stream s, float* out, float* mean, float* rstd, const float* x,
                       const float* weight, const float* bias, int64_t N, int64_t C, float eps);
// dx += (accumulates); dweight, dbias += (dbias may be null).
void layernorm_backward(Stream s, float* dx, float* dweight, float* dbias, const float* dout,
                        const float* x, const float* weight, const float* mean, const float* rstd,
                        int64_t N, int64_t C);
void rmsnorm_forward(Stream s, float* out, float* rstd, const float* x, const float* weight,
                     int64_t N, int64_t C, float eps);
void rmsnorm_backward(Stream s, float* dx, float* dweight, const float* dout, const float* x,
                      const float* weight, const float* rstd, int64_t N, int64_t C);
void gelu_forward(Stream s, float* out, const float* x, int64_t n);
void gelu_backward(Stream s, float* dx, const float* x, const float* dout, int64_t n);
void swiglu_forward(Stream s, float* out, const float* h, int64_t N, int64_t F);
void swiglu_backward(Stream s, float* dh, const float* dout, const float* h, int64_t N, int64_t F);
// cos/sin tables as kernels::rope_tables made them (copied to the device).
void rope_apply(Stream s, float* x, const float* cos_table, const float* sin_table, int64_t B,
                int64_t T, int64_t row_stride, int64_t offset, int64_t heads, int64_t HS,
                bool inverse);
void add_bias(Stream s, float* y, const float* bias, int64_t N, int64_t C);
// dbias (OUT) += column sums of dy (N, OUT).
void linear_bias_backward(Stream s, float* dbias, const float* dy, int64_t N, int64_t OUT);

// ---- precision: casts, loss scaling, optimizer (elementwise.cu) ----

void to_bf16(Stream s, uint16_t* dst, const float* src, int64_t n);
void from_bf16(Stream s, float* dst, const uint16_t* src, int64_t n);
// dst = src rounded to the fp16 grid (overflow to inf), kept in fp32.
void copy_round_to_f16(Stream s, float* dst, const float* src, int64_t n);
void round_to_f16(Stream s, float* x, int64_t n);
void scale_inplace(Stream s, float* x, int64_t n, float scale);
void add_inplace(Stream s, float* y, const float* x, int64_t n);
// Sum of squares in double, returned to the host (synchronises the stream).
// `partial` is device scratch of sum_squares_scratch() doubles.
double sum_squares(Stream s, const float* x, int64_t n, double* partial);
int64_t sum_squares_scratch();
// Whether any element is inf or NaN (loss-scaler overflow), via `flag`
// (one device int); synchronises.
bool has_nonfinite(Stream s, const float* x, int64_t n, int* flag);
void adamw_update(Stream s, float* param, const float* grad, float* m, float* v, int64_t n,
                  float lr, float beta1, float beta2, float eps, float weight_decay, int64_t t,
                  float grad_scale);
void adamw_update_bf16_copy(Stream s, float* param, uint16_t* param_bf16, const float* grad,
                            float* m, float* v, int64_t n, float lr, float beta1, float beta2,
                            float eps, float weight_decay, int64_t t, float grad_scale);

// ---- attention (attention.cu): flash-style, no (T, T) matrix ----

//   qkv (B, T, (NH + 2 KVH) HS), out (B, T, NH HS), lse (B, NH, T); HS <= 128.
void attention_forward(Stream s, float* out, float* lse, const float* qkv, int64_t B, int64_t T,
                       int64_t NH, int64_t KVH, int64_t HS);
// dqkv (B, T, (NH + 2 KVH) HS) written. `scratch` holds
// attention_backward_scratch floats.
void attention_backward(Stream s, float* dqkv, const float* dout, const float* qkv,
                        const float* out, const float* lse, int64_t B, int64_t T, int64_t NH,
                        int64_t KVH, int64_t HS, float* scratch);
int64_t attention_backward_scratch(int64_t B, int64_t T, int64_t NH);

// ---- LM head fused with cross-entropy (cross_entropy.cu) ----

// As kernels::lm_head_cross_entropy: blocks of lm_head_rows rows; scratch
// (lm_head_scratch_floats) holds one block's logits, `stats` two doubles
// and one int64 of device scratch (lm_head_stats_bytes). Returns the summed
// loss (synchronises).
int64_t lm_head_scratch_floats(int64_t N, int64_t V);
int64_t lm_head_stats_bytes();
double lm_head_cross_entropy(GemmContext& ctx, const float* h, const float* W,
                             const int32_t* targets, int64_t N, int64_t C, int64_t V,
                             float grad_scale, float* dh, float* dW, int64_t* valid, float* scratch,
                             int64_t scratch_floats, void* stats);

}  // namespace apiary::kernels::cuda
