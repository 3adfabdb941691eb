// apiary_device_train: DeviceModel's training step on one device, cpu or
// cuda, for scripts/device-check.sh: the loss curve of a fixed pool of
// batches (the same on every device, so two runs' curves compare step by
// step) and the speed (tokens/s, and MFU against --peak-tflops, the bf16
// GEMM rate the same run measured). One JSON object per step, then a summary.
//   apiary_device_train --device cuda --preset gpt2-124m --batch 8 --seq 1024 --steps 20
//       [--precision fp32|bf16] [--lr 6e-4] [--warmup 3] [--peak-tflops 750]

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/model_spec.h"
#include "core/rng.h"
#include "device/context.h"
#include "model/device_model.h"

namespace {

using namespace apiary;

struct Args {
    std::string device = "cpu", preset = "tiny", precision = "fp32";
    int64_t batch = 4, seq = 64, steps = 10, warmup = 3, pool = 4;
    double lr = 6e-4, peak_tflops = 0;
};

Args parse(int argc, char** argv) {
    Args a;
    for (int i = 1; i < argc; ++i) {
        const std::string k = argv[i];
        if (i + 1 >= argc) throw ConfigError(fmt::format("{} needs a value", k));
        const std::string v = argv[++i];
        if (k == "--device")
            a.device = v;
        else if (k == "--preset")
            a.preset = v;
        else if (k == "--precision")
            a.precision = v;
        else if (k == "--batch")
            a.batch = std::stoll(v);
        else if (k == "--seq")
            a.seq = std::stoll(v);
        else if (k == "--steps")
            a.steps = std::stoll(v);
        else if (k == "--warmup")
            a.warmup = std::stoll(v);
        else if (k == "--lr")
            a.lr = std::stod(v);
        else if (k == "--peak-tflops")
            a.peak_tflops = std::stod(v);
        else
            throw ConfigError(fmt::format("unknown argument {}", k));
    }
    return a;
}

}  // namespace

int main(int argc, char** argv) try {
    const Args a = parse(argc, argv);
    const device::DeviceKind kind = device::parse_device(a.device, "--device");
    auto ctx = device::DeviceContext::open(kind, 0, "--device");
    const core::ModelSpec& spec = core::preset(a.preset);
    const model::Precision precision = model::parse_precision(a.precision);
    // The host model gives the registry and the initial weights (its own
    // activations are sized for one row: it never runs).
    model::Transformer host(spec, 1, 1);
    host.init(1337);
    model::DeviceModel dev(host, a.batch, a.seq, precision, *ctx);
    dev.load_params(host.params());

    const int64_t n = a.batch * a.seq;
    std::vector<std::vector<int32_t>> tokens(size_t(a.pool)), targets(size_t(a.pool));
    const core::Philox rng(42, 1);
    for (int64_t p = 0; p < a.pool; ++p) {
        // A token sequence with structure (each next token a function of the
        // last two, plus noise), so the loss can fall below log(V).
        auto& t = tokens[size_t(p)];
        t.resize(size_t(n + 1));
        t[0] = int32_t(rng.u32(uint64_t(p)) % uint32_t(spec.vocab_size));
        t[1] = int32_t(rng.u32(uint64_t(p) + 1000) % uint32_t(spec.vocab_size));
        for (int64_t i = 2; i <= n; ++i) {
            const uint32_t noise = rng.u32(uint64_t(p * (n + 1) + i) + 7777);
            t[size_t(i)] =
                noise % 8 == 0
                    ? int32_t(noise / 8 % uint32_t(spec.vocab_size))
                    : int32_t((t[size_t(i - 1)] * 31 + t[size_t(i - 2)] * 7 + 3) % spec.vocab_size);
        }
        targets[size_t(p)].assign(t.begin() + 1, t.end());
        t.pop_back();
    }
    model::DeviceAdamW opt;
    opt.lr = float(a.lr);
    std::vector<double> times;
    double loss = 0;
    for (int64_t step = 1; step <= a.steps; ++step) {
        const auto t0 = std::chrono::steady_clock::now();
        dev.zero_grads();
        const size_t p = size_t((step - 1) % a.pool);
        const model::LossResult r = dev.forward_backward(tokens[p].data(), targets[p].data(),
                                                         a.batch, a.seq, 1.0f / float(n));
        const double norm = dev.adamw_step(opt, step);
        ctx->ops().synchronize();
        const double s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (step > a.warmup) times.push_back(s);
        loss = r.mean();
        std::printf("{\"step\": %lld, \"loss\": %.6f, \"grad_norm\": %.6f, \"ms\": %.3f}\n",
                    (long long)step, loss, norm, s * 1e3);
        std::fflush(stdout);
    }
    std::sort(times.begin(), times.end());
    const double med = times.empty() ? 0.0 : times[times.size() / 2];
    const double tps = med > 0 ? double(n) / med : 0.0;
    const double flops = dev.step_flops(a.batch, a.seq);
    const double mfu = (med > 0 && a.peak_tflops > 0) ? flops / med / (a.peak_tflops * 1e12) : 0.0;
    const core::MemStats mem = ctx->arena().stats();
    std::printf(
        "{\"summary\": true, \"device\": \"%s\", \"preset\": \"%s\", \"precision\": \"%s\", "
        "\"batch\": %lld, \"seq\": %lld, \"steps\": %lld, \"final_loss\": %.6f, "
        "\"median_step_ms\": %.3f, \"tokens_per_s\": %.1f, \"tflops\": %.2f, \"mfu\": %.4f, "
        "\"peak_tflops\": %.1f, \"device_bytes\": %lld}\n",
        ctx->describe().c_str(), a.preset.c_str(), a.precision.c_str(), (long long)a.batch,
        (long long)a.seq, (long long)a.steps, loss, med * 1e3, tps,
        med > 0 ? flops / med / 1e12 : 0.0, mfu, a.peak_tflops, (long long)mem.total_peak);
    return 0;
} catch (const std::exception& e) {
    std::fprintf(stderr, "apiary_device_train: %s\n", e.what());
    return 1;
}
