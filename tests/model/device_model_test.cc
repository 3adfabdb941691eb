// DeviceModel (the single-device step through device::Ops) against the
// Transformer on the CPU: with CpuOps the same kernels run in the same order,
// so loss, every gradient and the updated parameters must agree to fp32
// rounding; bf16 matmuls stay within bf16's. On a GPU, device-check.sh
// holds the CudaOps run to this one.

#include "model/device_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/model_spec.h"
#include "core/rng.h"
#include "kernels/kernels.h"

namespace apiary::model {
namespace {

struct Batch {
    std::vector<int32_t> tokens, targets;
};

Batch batch(int64_t B, int64_t T, int V, uint64_t seed) {
    core::Philox rng(seed, 3);
    Batch b;
    for (int64_t i = 0; i < B * T; ++i) {
        b.tokens.push_back(int32_t(rng.u32(uint64_t(2 * i)) % uint32_t(V)));
        b.targets.push_back(i % 7 == 3 ? -1 : int32_t(rng.u32(uint64_t(2 * i + 1)) % uint32_t(V)));
    }
    return b;
}

double rel(const std::vector<float>& got, const float* want, size_t n) {
    double num = 0.0, den = 1e-30;
    for (size_t i = 0; i < n; ++i) {
        if (!std::isfinite(got[i])) return INFINITY;
        num = std::max(num, std::fabs(double(got[i]) - double(want[i])));
        den = std::max(den, std::fabs(double(want[i])));
    }
    return num / den;
}

void check_against_transformer(const char* preset, Precision precision, double tol) {
    const core::ModelSpec& spec = core::preset(preset);
    const int64_t B = 2, T = 37;  // T past a 32-row attention tile
    Transformer host(spec, B, T, precision);
    host.init(11);
    auto ctx = device::DeviceContext::open(device::DeviceKind::cpu, 0);
    DeviceModel dev(host, B, T, precision, *ctx);
    dev.load_params(host.params());
    const Batch b = batch(B, T, spec.vocab_size, 5);
    host.zero_grads();
    const LossResult want = host.forward_backward(b.tokens.data(), b.targets.data(), B, T, 0.01f);
    const LossResult got = dev.forward_backward(b.tokens.data(), b.targets.data(), B, T, 0.01f);
    EXPECT_EQ(got.count, want.count);
    EXPECT_NEAR(got.loss_sum, want.loss_sum, tol * want.loss_sum) << preset;
    std::vector<float> g(size_t(dev.flat_size()));
    dev.read_grads(g.data());
    EXPECT_LT(rel(g, host.grads(), g.size()), precision == Precision::fp32 ? 1e-5 : 3e-2) << preset;
    // Per tensor as well: a small tensor's error would hide in the global max.
    for (const ParamInfo& e : host.registry().entries()) {
        std::vector<float> part(g.begin() + e.offset, g.begin() + e.offset + e.numel());
        EXPECT_LT(rel(part, host.grads() + e.offset, part.size()),
                  precision == Precision::fp32 ? 1e-4 : 5e-2)
            << preset << " " << e.name;
    }
}

TEST(DeviceModel, Gpt2MatchesTheTransformerFp32) {
    check_against_transformer("tiny", Precision::fp32, 1e-6);
}

TEST(DeviceModel, LlamaMatchesTheTransformerFp32) {
    check_against_transformer("tiny-llama", Precision::fp32, 1e-6);
}

// bf16 here keeps attention and the head in fp32 (the Transformer's bf16 does
// not), so only bf16's tolerance holds.
TEST(DeviceModel, Gpt2Bf16WithinBf16OfTheTransformer) {
    check_against_transformer("tiny", Precision::bf16, 1e-2);
}

TEST(DeviceModel, AdamWStepsLowerTheLossWithDecayPerTensor) {
    const core::ModelSpec& spec = core::preset("tiny");
    const int64_t B = 2, T = 16;
    Transformer host(spec, B, T);
    host.init(3);
    auto ctx = device::DeviceContext::open(device::DeviceKind::cpu, 0);
    DeviceModel dev(host, B, T, Precision::fp32, *ctx);
    dev.load_params(host.params());
    const Batch b = batch(B, T, spec.vocab_size, 9);
    DeviceAdamW a;
    a.lr = 1e-2f;
    a.grad_clip = 0.5f;
    double first = 0, last = 0;
    const size_t n = size_t(dev.flat_size());
    for (int step = 1; step <= 5; ++step) {
        dev.zero_grads();
        const LossResult r =
            dev.forward_backward(b.tokens.data(), b.targets.data(), B, T, 1.0f / float(B * T));
        (step == 1 ? first : last) = r.mean();
        std::vector<float> p(n), g(n);
        dev.read_params(p.data());
        dev.read_grads(g.data());
        const double norm = std::sqrt(kernels::sum_squares(g.data(), int64_t(n)));
        const float scale = norm > 0.5 ? float(0.5 / norm) : 1.0f;
        // What the step must do: AdamW per tensor, decay only where the
        // registry says, moments starting at 0 (checked on the first step).
        if (step == 1) {
            std::vector<float> m(n, 0.0f), v(n, 0.0f);
            for (const ParamInfo& e : host.registry().entries()) {
                kernels::adamw_update(p.data() + e.offset, g.data() + e.offset, m.data() + e.offset,
                                      v.data() + e.offset, e.numel(), a.lr, a.beta1, a.beta2, a.eps,
                                      e.decay ? a.weight_decay : 0.0f, 1, scale);
            }
        }
        EXPECT_NEAR(dev.adamw_step(a, step), norm, 1e-6 * norm);
        if (step == 1) {
            std::vector<float> got(n);
            dev.read_params(got.data());
            EXPECT_EQ(got, p);
        }
    }
    EXPECT_LT(last, first - 0.1);  // one fixed batch: the loss must fall
}

TEST(DeviceModel, RefusesWhatItDoesNotRun) {
    auto ctx = device::DeviceContext::open(device::DeviceKind::cpu, 0);
    Transformer host(core::preset("tiny"), 1, 8);
    EXPECT_THROW(DeviceModel(host, 1, 8, Precision::fp16, *ctx), ConfigError);
}

}  // namespace
}  // namespace apiary::model
