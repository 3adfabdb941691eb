#pragma once
// The one dispatch header for compute kernels. Today every kernel runs on the
// CPU (kernels/cpu/); a CUDA backend will implement the same signatures.
//
// Shape letters: B batch, T sequence, C channels, V vocabulary, NH heads,
// KVH key/value heads, HS head size, F MLP hidden width, N = B*T rows.
// Conventions: row-major, contiguous unless a stride is given; a backward
// kernel ACCUMULATES (+=) into parameter gradients (so micro-steps add up)
// and WRITES input gradients unless its comment says otherwise.

#include <cstdint>

namespace apiary::kernels {

// ---- matrix multiply (oneDNN) ----

// C (M, N) = op(A) (M, K) * op(B) (K, N) + beta * C; row-major with leading
// dimensions; op is a transpose when the flag is set.
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
          const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

// A linear layer as in torch.nn.Linear: y = x W^T + b.
//   x (N, IN), weight (OUT, IN), bias (OUT) or null, y (N, OUT)
void linear_forward(float* y, const float* x, const float* weight, const float* bias, int64_t N,
                    int64_t IN, int64_t OUT);
// dx (N, IN) = dy W (written); dweight (OUT, IN) += dy^T x; dbias (OUT) +=
// column sums of dy. dx may be null.
void linear_backward(float* dx, float* dweight, float* dbias, const float* dy, const float* x,
                     const float* weight, int64_t N, int64_t IN, int64_t OUT);

// ---- embeddings ----

// out (B, T, C) = wte[tokens] (+ wpe[t] when wpe is non-null)
void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                       int64_t B, int64_t T, int64_t C);
// dwte (V, C) += scatter of dout; dwpe (maxT, C) += sum over batch (if non-null)
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                        int64_t B, int64_t T, int64_t C);

// ---- normalisation ----

// LayerNorm over the last dim: out (N, C), mean (N), rstd (N) saved for backward.
void layernorm_forward(float* out, float* mean, float* rstd, const float* x, const float* weight,
                       const float* bias, int64_t N, int64_t C, float eps);
// dx (N, C) += ...  (accumulates: the residual stream adds gradients)
void layernorm_backward(float* dx, float* dweight, float* dbias, const float* dout, const float* x,
                        const float* weight, const float* mean, const float* rstd, int64_t N,
                        int64_t C);
// RMSNorm: out = x * rstd * weight; rstd (N) saved.
void rmsnorm_forward(float* out, float* rstd, const float* x, const float* weight, int64_t N,
                     int64_t C, float eps);
// dx (N, C) += ... (accumulates)
void rmsnorm_backward(float* dx, float* dweight, const float* dout, const float* x,
                      const float* weight, const float* rstd, int64_t N, int64_t C);

// ---- activations ----

// GELU, tanh approximation (GPT-2). out (n), in place allowed.
void gelu_forward(float* out, const float* x, int64_t n);
// dx (n) = dout * gelu'(x); dx may alias dout.
void gelu_backward(float* dx, const float* x, const float* dout, int64_t n);
// SwiGLU: out (N, F) = silu(a) * b, with a = h[:, :F], b = h[:, F:] of h (N, 2F).
void swiglu_forward(float* out, const float* h, int64_t N, int64_t F);
// dh (N, 2F) from dout (N, F).
void swiglu_backward(float* dh, const float* dout, const float* h, int64_t N, int64_t F);

// ---- rotary position embedding (rotate-half convention of Hugging Face LLaMA) ----

// cos/sin tables (maxT, HS/2) for base theta.
void rope_tables(float* cos_table, float* sin_table, int64_t max_T, int64_t HS, float theta);
// Rotates `heads` heads of size HS in place in x (B, T, row_stride), starting
// at column `offset`. inverse=true applies the transpose (backward).
void rope_apply(float* x, const float* cos_table, const float* sin_table, int64_t B, int64_t T,
                int64_t row_stride, int64_t offset, int64_t heads, int64_t HS, bool inverse);

// ---- attention ----

// Causal multi-head attention with grouped-query heads, computed blockwise with
// an online softmax: no (T, T) score matrix is ever held.
//   qkv (B, T, (NH + 2 KVH) HS): q heads, then k heads, then v heads
//   out (B, T, NH HS); lse (B, NH, T) log-sum-exp saved for backward
void attention_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t NH,
                       int64_t KVH, int64_t HS);
// dqkv (B, T, (NH + 2 KVH) HS) written.
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, int64_t B, int64_t T, int64_t NH, int64_t KVH,
                        int64_t HS);

// ---- LM head fused with cross-entropy ----

// The LM head (logits = h W^T, W (V, C)) and the mean cross-entropy over the
// rows whose target is >= 0. Logits exist only for a block of rows at a time.
// Returns the summed loss over valid rows; `valid` gets their count.
// If dh is non-null, also computes gradients of (loss_sum * grad_scale):
// dh (N, C) written, dW (V, C) accumulated. lse_out (N), if non-null, gets
// each row's log-sum-exp.
double lm_head_cross_entropy(const float* h, const float* W, const int32_t* targets, int64_t N,
                             int64_t C, int64_t V, float grad_scale, float* dh, float* dW,
                             int64_t* valid, float* scratch, int64_t scratch_floats);
// Floats of scratch lm_head_cross_entropy needs for these sizes.
int64_t lm_head_scratch_floats(int64_t N, int64_t V);

// Log-sum-exp per row over vocabulary chunks (online), forward only.
//   h (N, C), W (V, C), lse (N); target_logit (N) for targets >= 0.
void lm_head_logsumexp(float* lse, float* target_logit, const float* h, const float* W,
                       const int32_t* targets, int64_t N, int64_t C, int64_t V,
                       int64_t vocab_chunk);

// ---- mixture of experts (cpu/moe.cc) ----
// More shape letters: E experts, K experts per token (top-k), M = rows of
// the expert-ordered buffer (token copies that were kept, at most N K).

// How router logits become scores: softmax over the experts (Switch,
// GShard, Mixtral) or an independent sigmoid per expert (DeepSeek-V3).
enum class MoeRouter : int { softmax = 0, sigmoid = 1 };

// Rows each expert may take: ceil(capacity_factor N K / E), at most N;
// dropless: N (a token picks an expert once, so no expert gets more).
int64_t moe_capacity(int64_t N, int64_t E, int64_t K, double capacity_factor, bool dropless);

// Outputs of the routing, caller-owned.
struct MoeRouteOut {
    float* probs = nullptr;       // (N, E) softmax probabilities or sigmoid scores
    int32_t* expert = nullptr;    // (N, K) chosen experts, best first
    float* gate = nullptr;        // (N, K) combine weights, 0 where dropped
    int32_t* slot = nullptr;      // (N, K) row in the expert-ordered buffer, -1 where dropped
    int64_t* offsets = nullptr;   // (E + 1) first row of each expert; offsets[E] = M
    int32_t* token_of = nullptr;  // (N K) the token of each row (the first M are set)
    int64_t* routed = nullptr;    // (E) choices of each expert before the capacity cut
    int64_t* dropped = nullptr;   // (E) of those, the ones over capacity
};
// The two router losses of one batch, before their coefficients:
//   aux = E sum_e f_e P_e (Switch / GShard load balancing; 1 when balanced),
//     f_e = routed_e / (N K), P_e = mean over tokens of the score of e
//     (softmax probability; for sigmoid the scores normalised per token);
//   z = mean over tokens of logsumexp(logits)^2 (ST-MoE router z-loss).
struct MoeLosses {
    double aux = 0.0, z = 0.0;
};
// Top-K choice per token by softmax probability, or by sigmoid score plus
// bias (E; null: none; the bias steers the choice only, never the gates).
// Ties go to the lower expert index. Gates: the chosen score itself when
// K = 1 (Switch), the chosen scores normalised to sum 1 when K > 1
// (Mixtral, DeepSeek-V3). Capacity: choices are admitted first choices of
// all tokens first, then second choices, each in token order; a choice
// past its expert's capacity is dropped (gate 0: the token's residual
// passes it by). Rows are ordered by expert, then by admission.
//   logits (N, E)
MoeLosses moe_route_forward(const MoeRouteOut& out, const float* logits, const float* bias,
                            int64_t N, int64_t E, int64_t K, MoeRouter router, int64_t capacity);
// dlogits (N, E) written: the gradient of sum(dgate * gate) + aux_coef aux
// + z_coef z, with dgate (N, K) the gradient of the combine weights (0 where
// dropped; the routing counts f_e are constants). probs, expert, slot and
// routed as the forward wrote them.
void moe_route_backward(float* dlogits, const float* dgate, const float* logits,
                        const float* probs, const int32_t* expert, const int64_t* routed,
                        int64_t N, int64_t E, int64_t K, MoeRouter router, float aux_coef,
                        float z_coef);
// xg (M, C) = the rows of x (N, C) named by token_of (M).
void moe_gather(float* xg, const float* x, const int32_t* token_of, int64_t M, int64_t C);
// dx (N, C) += the rows of dxg (M, C) back at their tokens (slot (N, K)).
void moe_gather_backward(float* dx, const float* dxg, const int32_t* slot, int64_t N, int64_t K,
                         int64_t C);
// y (N, C) += sum over a token's kept choices of gate * ye[slot]; ye (M, C).
void moe_combine_forward(float* y, const float* ye, const int32_t* slot, const float* gate,
                         int64_t N, int64_t K, int64_t C);
// dye (M, C) = gate * dy of the row's token (written); dgate (N, K) =
// dot(dy, ye[slot]) (written; 0 where dropped).
void moe_combine_backward(float* dye, float* dgate, const float* dy, const float* ye,
                          const int32_t* slot, const float* gate, int64_t N, int64_t K, int64_t C);
// One linear layer per expert over its rows of the expert-ordered buffer,
// one gemm each: y[rows of e] (., OUT) = x[rows of e] (., IN) W[e]^T, with
// W[e] (OUT, IN) and rows [offsets[e], offsets[e + 1]).
void grouped_linear_forward(float* y, const float* x, const float* const* W,
                            const int64_t* offsets, int64_t E, int64_t IN, int64_t OUT);
// dx (M, IN) = dy W[e] (written; may be null); dW[e] (OUT, IN) += dy^T x.
void grouped_linear_backward(float* dx, float* const* dW, const float* dy, const float* x,
                             const float* const* W, const int64_t* offsets, int64_t E,
                             int64_t IN, int64_t OUT);

// ---- optimizer ----

// AdamW (Loshchilov & Hutter 2019) on one contiguous range, with decoupled
// weight decay (the caller passes 0 for norms and biases). Bias corrections
// use the 1-based step t; the gradient is multiplied by grad_scale first
// (clipping, loss-scale removal).
void adamw_update(float* param, const float* grad, float* m, float* v, int64_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int64_t t,
                  float grad_scale);
// adamw_update that also writes param_bf16 (n) = the updated param rounded
// to bf16 as to_bf16 rounds: bf16 training's weight copy, in the same pass
// over memory instead of a second one.
void adamw_update_bf16_copy(float* param, uint16_t* param_bf16, const float* grad, float* m,
                            float* v, int64_t n, float lr, float beta1, float beta2, float eps,
                            float weight_decay, int64_t t, float grad_scale);
// Sum of squares in double precision (for the global gradient norm).
double sum_squares(const float* x, int64_t n);
void scale_inplace(float* x, int64_t n, float s);
void add_inplace(float* y, const float* x, int64_t n);

}  // namespace apiary::kernels

namespace apiary::kernels {
// Measured fp32 GEMM throughput (FLOP/s) of this process's threads on square
// 1024 matrices, best of repeated runs for about `seconds`: the peak that
// MFU is reported against on CPU.
double measure_gemm_peak_flops(double seconds = 0.3);
}  // namespace apiary::kernels

// ---- reduced precision (bf16 compute, fp16 emulation) ----
namespace apiary::kernels {
// C (M, N) fp32 = op(A) op(B) (+ C when beta = 1), A and B bf16, fp32 accumulation.
void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const uint16_t* A,
               int64_t lda, const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc);
// Whether gemm_bf16 runs as oneDNN's bf16 matmul (false where oneDNN has none
// for this CPU, as on AVX2-only machines: the operands are then widened to
// fp32 and multiplied by sgemm, same products, fp32 speed).
bool gemm_bf16_is_native();
// Tests: run every bf16 GEMM through the widening path even where the native
// one exists, so both are checked on any machine.
void force_gemm_bf16_widening(bool on);
// Round to nearest even into bf16.
void to_bf16(uint16_t* dst, const float* src, int64_t n);
// Puts values on the fp16 grid in place (emulated fp16 storage): magnitudes
// beyond 65504 become inf, as in a real fp16 tensor.
void round_to_f16(float* x, int64_t n);
void copy_round_to_f16(float* dst, const float* src, int64_t n);
// y (N, OUT) = x W^T + b with x (N, IN) and W (OUT, IN) in bf16.
void linear_forward_bf16(float* y, const uint16_t* x, const uint16_t* weight, const float* bias,
                         int64_t N, int64_t IN, int64_t OUT);
// linear_forward_bf16 with y (N, OUT) in bf16, rounded to nearest even from
// the fp32 accumulator by oneDNN: for an output only ever read in bf16.
void linear_forward_bf16_out(uint16_t* y, const uint16_t* x, const uint16_t* weight,
                             const float* bias, int64_t N, int64_t IN, int64_t OUT);
// dx (N, IN) = dy W; dweight (OUT, IN) += dy^T x; operands bf16, results fp32.
// (The bias gradient needs the fp32 dy: use linear_bias_backward.)
void linear_backward_bf16(float* dx, float* dweight, const uint16_t* dy, const uint16_t* x,
                          const uint16_t* weight, int64_t N, int64_t IN, int64_t OUT);
// dbias (OUT) += column sums of dy (N, OUT).
void linear_bias_backward(float* dbias, const float* dy, int64_t N, int64_t OUT);
double measure_gemm_bf16_peak_flops(double seconds = 0.3);
// Kernels whose output feeds a bf16 matmul, writing it in bf16 directly
// (the fp32 kernels' formulas; out/dx rounded as to_bf16 rounds).
// layernorm_forward with out (N, C) bf16.
void layernorm_forward_bf16(uint16_t* out, float* mean, float* rstd, const float* x,
                            const float* weight, const float* bias, int64_t N, int64_t C,
                            float eps);
// gelu_forward with out (n) bf16.
void gelu_forward_bf16(uint16_t* out, const float* x, int64_t n);
// gelu_backward on (N, W) with dx bf16; col_sums (W), if non-null, += the
// column sums of the fp32 dx (the bias gradient of the matmul that made x).
void gelu_backward_bf16(uint16_t* dx, float* col_sums, const float* x, const float* dout, int64_t N,
                        int64_t W);
// dst (N, W) = to_bf16(src); col_sums (W), if non-null, += column sums of src.
void to_bf16_column_sums(uint16_t* dst, float* col_sums, const float* src, int64_t N, int64_t W);
// Causal attention as attention_forward/backward with q, k, v in bf16: block
// products on bf16 pairs with fp32 accumulation; softmax statistics and
// every gradient in fp32. Error against fp32 attention on the same bf16
// inputs: the bf16 rounding of P, dS and dO (at most 2^-8 relative each).
//   qkv (B, T, (NH + 2 KVH) HS) bf16; out (B, T, NH HS) bf16 (it feeds the
//   output projection's bf16 matmul); lse (B, NH, T) fp32
void attention_forward_bf16(uint16_t* out, float* lse, const uint16_t* qkv, int64_t B, int64_t T,
                            int64_t NH, int64_t KVH, int64_t HS);
// dqkv (B, T, (NH + 2 KVH) HS) fp32 written; dout (B, T, NH HS) fp32; out and
// lse as the forward left them.
void attention_backward_bf16(float* dqkv, const float* dout, const uint16_t* qkv,
                             const uint16_t* out, const float* lse, int64_t B, int64_t T,
                             int64_t NH, int64_t KVH, int64_t HS);
// lm_head_cross_entropy with bf16 hidden states and head weights; the logit
// gradients are rounded to bf16 (scratch_bf16: lm_head_scratch_bf16
// elements) for the two backward matmuls.
int64_t lm_head_scratch_bf16(int64_t N, int64_t V);
double lm_head_cross_entropy_bf16(const uint16_t* h, const uint16_t* W, const int32_t* targets,
                                  int64_t N, int64_t C, int64_t V, float grad_scale, float* dh,
                                  float* dW, int64_t* valid, float* scratch, int64_t scratch_floats,
                                  uint16_t* scratch_bf16);
}  // namespace apiary::kernels

// ---- tensor parallelism (cpu/tensor_parallel.cc) ----
namespace apiary::kernels {
// y (N, C) += bias (C) on every row: a row-parallel matmul's bias, added once
// after the ranks' partial outputs are summed.
void add_bias(float* y, const float* bias, int64_t N, int64_t C);
// out (N, C) = wte[tokens - v0] for the tokens in [v0, v0 + Vl) this rank
// holds (wte (Vl, C)), zero rows for the others (the ranks' outputs sum to
// the full lookup).
void embedding_lookup(float* out, const int32_t* tokens, const float* wte, int64_t v0, int64_t Vl,
                      int64_t N, int64_t C);
// out (N, C) += wpe[(row0 + i) % T]: learned positions of rows row0.. of a
// (B, T) batch flattened to B*T rows.
void add_positions(float* out, const float* wpe, int64_t row0, int64_t T, int64_t N, int64_t C);
// dwte (Vl, C) += dout rows of the tokens this rank holds.
void embedding_lookup_backward(float* dwte, const float* dout, const int32_t* tokens, int64_t v0,
                               int64_t Vl, int64_t N, int64_t C);
// dwpe (T, C) += dout rows by position, as add_positions placed them.
void positions_backward(float* dwpe, const float* dout, int64_t row0, int64_t T, int64_t N,
                        int64_t C);

// Reductions over the ranks sharing a vocabulary, applied in place to n
// floats; called the same number of times with the same n on every rank.
struct RowReduce {
    void* ctx = nullptr;
    void (*max)(void* ctx, float* x, int64_t n) = nullptr;
    void (*sum)(void* ctx, float* x, int64_t n) = nullptr;
};
// This rank's slice of the LM head: rows [v0, v0 + Vl) of W, fp32 (h, W)
// or bf16 (h16, W16, the other pair null). h (N, C), W (Vl, C).
struct VocabHead {
    const float* h = nullptr;
    const float* W = nullptr;
    const uint16_t* h16 = nullptr;
    const uint16_t* W16 = nullptr;
    int64_t Vl = 0, v0 = 0;
};
int64_t lm_head_vp_scratch_floats(int64_t N, int64_t Vl);
// lm_head_cross_entropy over a vocabulary split across ranks: the loss is
// that of the whole vocabulary on every rank; dh (N, C), if non-null, gets
// this rank's part of the hidden-state gradient (the ranks' parts sum to
// it) and dW (Vl, C) += its slice's gradient. scratch_bf16 (rows x Vl) is
// used by the bf16 path only.
double lm_head_cross_entropy_vp(const VocabHead& head, const int32_t* targets, int64_t N, int64_t C,
                                float grad_scale, float* dh, float* dW, int64_t* valid,
                                float* scratch, int64_t scratch_floats, uint16_t* scratch_bf16,
                                const RowReduce& reduce);
}  // namespace apiary::kernels
