// apiary_cuda_bench: the ceilings of this GPU as apiary's kernels reach them,
// for scripts/device-check.sh (MFU is reported against the measured bf16
// cuBLASLt rate of the same run, not a datasheet). Prints one JSON object per
// line: the bf16 and fp32/tf32 GEMM rates on random data (8192^3 by
// default), and attention forward+backward at GPT-2 124M shapes. Each result
// is checked once (finite, non-zero) before it is timed.
//   apiary_cuda_bench [gemm_size] [repeats]

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "device/context.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/kernels.h"

namespace {

using namespace apiary;
namespace kc = apiary::kernels::cuda;

std::vector<float> random_host(size_t n, uint64_t seed) {
    core::Philox rng(seed, 7);
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = rng.normal(i);
    return v;
}

// Median milliseconds of `repeats` timed runs of f after two warm-ups.
template <typename F>
double median_ms(cudaStream_t s, int repeats, F&& f) {
    cudaEvent_t a, b;
    APIARY_CUDA_CALL(cudaEventCreate(&a));
    APIARY_CUDA_CALL(cudaEventCreate(&b));
    f();
    f();
    std::vector<double> t;
    for (int i = 0; i < repeats; ++i) {
        APIARY_CUDA_CALL(cudaEventRecord(a, s));
        f();
        APIARY_CUDA_CALL(cudaEventRecord(b, s));
        APIARY_CUDA_CALL(cudaEventSynchronize(b));
        float ms = 0;
        APIARY_CUDA_CALL(cudaEventElapsedTime(&ms, a, b));
        t.push_back(ms);
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

void check_finite(const float* dev, size_t n, const char* what) {
    std::vector<float> h(std::min<size_t>(n, 4096));
    APIARY_CUDA_CALL(cudaMemcpy(h.data(), dev, h.size() * 4, cudaMemcpyDeviceToHost));
    bool nonzero = false;
    for (float x : h) {
        if (!std::isfinite(x)) throw Error(fmt::format("{}: non-finite output", what));
        nonzero |= x != 0.0f;
    }
    if (!nonzero) throw Error(fmt::format("{}: all-zero output", what));
}

}  // namespace

int main(int argc, char** argv) try {
    const int64_t n = argc > 1 ? std::stoll(argv[1]) : 8192;
    const int repeats = argc > 2 ? std::stoi(argv[2]) : 10;
    const device::CudaProbe p = device::probe_cuda();
    device::require_device(device::DeviceKind::cuda, "apiary_cuda_bench");
    cudaDeviceProp prop{};
    APIARY_CUDA_CALL(cudaGetDeviceProperties(&prop, 0));
    std::printf("{\"device\": \"%s\", \"sms\": %d, \"gpus\": %d}\n", prop.name,
                prop.multiProcessorCount, p.count);
    cudaStream_t s;
    APIARY_CUDA_CALL(cudaStreamCreate(&s));
    kc::GemmContext ctx(s);

    const auto ha = random_host(size_t(n * n), 1), hb = random_host(size_t(n * n), 2);
    float *a, *b, *c;
    uint16_t *a16, *b16;
    APIARY_CUDA_CALL(cudaMalloc(&a, n * n * 4));
    APIARY_CUDA_CALL(cudaMalloc(&b, n * n * 4));
    APIARY_CUDA_CALL(cudaMalloc(&c, n * n * 4));
    APIARY_CUDA_CALL(cudaMalloc(&a16, n * n * 2));
    APIARY_CUDA_CALL(cudaMalloc(&b16, n * n * 2));
    APIARY_CUDA_CALL(cudaMemcpy(a, ha.data(), n * n * 4, cudaMemcpyHostToDevice));
    APIARY_CUDA_CALL(cudaMemcpy(b, hb.data(), n * n * 4, cudaMemcpyHostToDevice));
    kc::to_bf16(s, a16, a, n * n);
    kc::to_bf16(s, b16, b, n * n);
    const double flops = 2.0 * double(n) * double(n) * double(n);

    auto bf16 = [&] { kc::gemm_bf16(ctx, false, true, n, n, n, a16, n, b16, n, 0.0f, c, n); };
    bf16();
    APIARY_CUDA_CALL(cudaStreamSynchronize(s));
    check_finite(c, size_t(n * n), "bf16 gemm");
    const double ms16 = median_ms(s, repeats, bf16);
    std::printf("{\"bench\": \"gemm_bf16\", \"n\": %lld, \"ms\": %.4f, \"tflops\": %.1f}\n",
                (long long)n, ms16, flops / ms16 / 1e9);
    for (bool tf32 : {true, false}) {
        ctx.set_allow_tf32(tf32);
        auto f32 = [&] { kc::gemm(ctx, false, true, n, n, n, a, n, b, n, 0.0f, c, n); };
        f32();
        APIARY_CUDA_CALL(cudaStreamSynchronize(s));
        check_finite(c, size_t(n * n), "fp32 gemm");
        const double ms = median_ms(s, repeats, f32);
        std::printf("{\"bench\": \"gemm_%s\", \"n\": %lld, \"ms\": %.4f, \"tflops\": %.1f}\n",
                    tf32 ? "tf32" : "fp32", (long long)n, ms, flops / ms / 1e9);
    }

    // Attention at GPT-2 124M shapes (B=8, T=1024, NH=12, HS=64): causal
    // FLOPs 2 * 2 * B * NH * T^2 * HS / 2 forward, 2.5x that backward.
    const int64_t B = 8, T = 1024, NH = 12, HS = 64, W = 3 * NH * HS;
    float *qkv, *out, *lse, *dout, *dqkv, *scratch;
    APIARY_CUDA_CALL(cudaMalloc(&qkv, B * T * W * 4));
    APIARY_CUDA_CALL(cudaMalloc(&dqkv, B * T * W * 4));
    APIARY_CUDA_CALL(cudaMalloc(&out, B * T * NH * HS * 4));
    APIARY_CUDA_CALL(cudaMalloc(&dout, B * T * NH * HS * 4));
    APIARY_CUDA_CALL(cudaMalloc(&lse, B * NH * T * 4));
    APIARY_CUDA_CALL(cudaMalloc(&scratch, kc::attention_backward_scratch(B, T, NH) * 4));
    APIARY_CUDA_CALL(cudaMemcpy(qkv, ha.data(), B * T * W * 4, cudaMemcpyHostToDevice));
    APIARY_CUDA_CALL(cudaMemcpy(dout, hb.data(), B * T * NH * HS * 4, cudaMemcpyHostToDevice));
    const double attn_fwd = 2.0 * double(B * NH) * double(T * T) * double(HS);
    auto fwd = [&] { kc::attention_forward(s, out, lse, qkv, B, T, NH, NH, HS); };
    auto bwd = [&] {
        kc::attention_backward(s, dqkv, dout, qkv, out, lse, B, T, NH, NH, HS, scratch);
    };
    fwd();
    bwd();
    APIARY_CUDA_CALL(cudaStreamSynchronize(s));
    check_finite(out, size_t(B * T * NH * HS), "attention forward");
    check_finite(dqkv, size_t(B * T * W), "attention backward");
    const double msf = median_ms(s, repeats, fwd), msb = median_ms(s, repeats, bwd);
    std::printf(
        "{\"bench\": \"attention_fwd_fp32\", \"B\": %lld, \"T\": %lld, \"ms\": %.4f, "
        "\"tflops\": %.2f}\n",
        (long long)B, (long long)T, msf, attn_fwd / msf / 1e9);
    std::printf(
        "{\"bench\": \"attention_bwd_fp32\", \"B\": %lld, \"T\": %lld, \"ms\": %.4f, "
        "\"tflops\": %.2f}\n",
        (long long)B, (long long)T, msb, 2.5 * attn_fwd / msb / 1e9);
    return 0;
} catch (const std::exception& e) {
    std::fprintf(stderr, "apiary_cuda_bench: %s\n", e.what());
    return 1;
}
