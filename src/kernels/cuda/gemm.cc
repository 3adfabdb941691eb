// GEMMs through cuBLASLt. Row-major C (M, N) = op(A) op(B) is computed as the
// column-major C^T (N, M) = op(B)^T op(A)^T, which reads the same memory with
// no copies: cuBLASLt's first operand is our B, its second our A. A plan
// (descriptors and the heuristic's algorithm) is made once per shape and kept:
// the step loop calls the same few shapes every step.

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <tuple>
#include <utility>

#include "core/error.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/cuda_kernels.h"

namespace apiary::kernels::cuda {

namespace {

// Shape, types, tf32, and the alignment of the three pointers: cuBLASLt's
// heuristic cannot see the pointers and by default assumes 256-byte
// alignment, which sub-tensors of the flat buffers (64-byte aligned) and
// row blocks of odd widths do not have.
using PlanKey = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int,
                           int, bool, uint32_t, uint32_t, uint32_t>;

// The largest power of two (at most 256) that divides the address.
uint32_t alignment_of(const void* p) {
    const auto a = reinterpret_cast<uintptr_t>(p);
    uint32_t al = 256;
    while (al > 1 && a % al != 0) al /= 2;
    return al;
}

struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t x = nullptr, y = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
};

cudaDataType_t cuda_type(GemmType t) { return t == GemmType::f32 ? CUDA_R_32F : CUDA_R_16BF; }

}  // namespace

struct GemmContext::Impl {
    cudaStream_t stream = nullptr;
    cublasLtHandle_t lt = nullptr;
    void* workspace = nullptr;
    size_t workspace_bytes = 0;
    bool tf32 = false;
    std::map<PlanKey, Plan> plans;

    const Plan& plan(bool ta, bool tb, int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb,
                     int64_t ldc, GemmType ab, GemmType c_type, uint32_t align_a, uint32_t align_b,
                     uint32_t align_c) {
        const PlanKey key{ta,  tb,      M,           N,    K,       lda,     ldb,
                          ldc, int(ab), int(c_type), tf32, align_a, align_b, align_c};
        if (auto it = plans.find(key); it != plans.end()) return it->second;
        Plan p;
        const cublasComputeType_t compute =
            (ab == GemmType::f32 && tf32) ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
        APIARY_CUBLAS_CALL(cublasLtMatmulDescCreate(&p.desc, compute, CUDA_R_32F));
        const cublasOperation_t opx = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
        const cublasOperation_t opy = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
        APIARY_CUBLAS_CALL(
            cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &opx, sizeof(opx)));
        APIARY_CUBLAS_CALL(
            cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &opy, sizeof(opy)));
        // Stored (column-major) shapes: X = our B, Y = our A, C^T (N, M).
        APIARY_CUBLAS_CALL(cublasLtMatrixLayoutCreate(&p.x, cuda_type(ab), uint64_t(tb ? K : N),
                                                      uint64_t(tb ? N : K), ldb));
        APIARY_CUBLAS_CALL(cublasLtMatrixLayoutCreate(&p.y, cuda_type(ab), uint64_t(ta ? M : K),
                                                      uint64_t(ta ? K : M), lda));
        APIARY_CUBLAS_CALL(
            cublasLtMatrixLayoutCreate(&p.c, cuda_type(c_type), uint64_t(N), uint64_t(M), ldc));
        cublasLtMatmulPreference_t pref = nullptr;
        APIARY_CUBLAS_CALL(cublasLtMatmulPreferenceCreate(&pref));
        APIARY_CUBLAS_CALL(
            cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                 &workspace_bytes, sizeof(workspace_bytes)));
        // cuBLASLt's A is our B, its B our A.
        const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> aligns[] = {
            {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_b},
            {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_a},
            {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_c},
            {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_c}};
        for (const auto& [attr, value] : aligns) {
            APIARY_CUBLAS_CALL(
                cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value)));
        }
        cublasLtMatmulHeuristicResult_t result{};
        int found = 0;
        const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt, p.desc, p.x, p.y, p.c, p.c,
                                                                 pref, 1, &result, &found);
        cublasLtMatmulPreferenceDestroy(pref);
        if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
            throw DeviceError(fmt::format(
                "cuBLASLt has no algorithm for a {} GEMM M={} N={} K={} (lda {}, ldb {}, ldc {}, "
                "trans_a {}, trans_b {}): status {}",
                ab == GemmType::f32 ? "fp32" : "bf16", M, N, K, lda, ldb, ldc, ta, tb, int(st)));
        }
        p.algo = result.algo;
        return plans.emplace(key, p).first->second;
    }
};

GemmContext::GemmContext(Stream stream, int64_t workspace_bytes) : impl_(std::make_unique<Impl>()) {
    impl_->stream = stream;
    impl_->workspace_bytes = size_t(workspace_bytes);
    APIARY_CUBLAS_CALL(cublasLtCreate(&impl_->lt));
    APIARY_CUDA_CALL(cudaMalloc(&impl_->workspace, impl_->workspace_bytes));
}

GemmContext::~GemmContext() {
    for (auto& [key, p] : impl_->plans) {
        cublasLtMatrixLayoutDestroy(p.x);
        cublasLtMatrixLayoutDestroy(p.y);
        cublasLtMatrixLayoutDestroy(p.c);
        cublasLtMatmulDescDestroy(p.desc);
    }
    cudaFree(impl_->workspace);
    cublasLtDestroy(impl_->lt);
}

Stream GemmContext::stream() const { return impl_->stream; }
void GemmContext::set_allow_tf32(bool on) { impl_->tf32 = on; }

void gemm_ex(GemmContext& ctx, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
             const void* A, int64_t lda, const void* B, int64_t ldb, float beta, void* C,
             int64_t ldc, GemmType ab, GemmType c) {
    if (M == 0 || N == 0) return;
    APIARY_CHECK(c == GemmType::f32 || beta == 0.0f, "a bf16 GEMM output takes beta = 0, not {}",
                 beta);
    GemmContext::Impl& im = *ctx.impl_ptr();
    const Plan& p = im.plan(trans_a, trans_b, M, N, K, lda, ldb, ldc, ab, c, alignment_of(A),
                            alignment_of(B), alignment_of(C));
    const float alpha = 1.0f;
    APIARY_CUBLAS_CALL(cublasLtMatmul(im.lt, p.desc, &alpha, B, p.x, A, p.y, &beta, C, p.c, C, p.c,
                                      &p.algo, im.workspace, im.workspace_bytes, im.stream));
}

void gemm(GemmContext& ctx, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
          const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
          int64_t ldc) {
    gemm_ex(ctx, trans_a, trans_b, M, N, K, A, lda, B, ldb, beta, C, ldc, GemmType::f32,
            GemmType::f32);
}

void gemm_bf16(GemmContext& ctx, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
               const uint16_t* A, int64_t lda, const uint16_t* B, int64_t ldb, float beta, float* C,
               int64_t ldc) {
    gemm_ex(ctx, trans_a, trans_b, M, N, K, A, lda, B, ldb, beta, C, ldc, GemmType::bf16,
            GemmType::f32);
}

void linear_forward(GemmContext& ctx, float* y, const float* x, const float* weight,
                    const float* bias, int64_t N, int64_t IN, int64_t OUT) {
    gemm(ctx, false, true, N, OUT, IN, x, IN, weight, IN, 0.0f, y, OUT);
    if (bias) add_bias(ctx.stream(), y, bias, N, OUT);
}

void linear_backward(GemmContext& ctx, float* dx, float* dweight, float* dbias, const float* dy,
                     const float* x, const float* weight, int64_t N, int64_t IN, int64_t OUT) {
    if (dx) gemm(ctx, false, false, N, IN, OUT, dy, OUT, weight, IN, 0.0f, dx, IN);
    gemm(ctx, true, false, OUT, IN, N, dy, OUT, x, IN, 1.0f, dweight, IN);
    if (dbias) linear_bias_backward(ctx.stream(), dbias, dy, N, OUT);
}

void linear_forward_bf16(GemmContext& ctx, float* y, const uint16_t* x, const uint16_t* weight,
                         const float* bias, int64_t N, int64_t IN, int64_t OUT) {
    gemm_bf16(ctx, false, true, N, OUT, IN, x, IN, weight, IN, 0.0f, y, OUT);
    if (bias) add_bias(ctx.stream(), y, bias, N, OUT);
}

void linear_backward_bf16(GemmContext& ctx, float* dx, float* dweight, const uint16_t* dy,
                          const uint16_t* x, const uint16_t* weight, int64_t N, int64_t IN,
                          int64_t OUT) {
    if (dx) gemm_bf16(ctx, false, false, N, IN, OUT, dy, OUT, weight, IN, 0.0f, dx, IN);
    gemm_bf16(ctx, true, false, OUT, IN, N, dy, OUT, x, IN, 1.0f, dweight, IN);
}

}  // namespace apiary::kernels::cuda
