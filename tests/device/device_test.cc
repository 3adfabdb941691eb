// The device layer without a GPU: the refusal of train.device = cuda where it
// cannot run, device-memory accounting, rank-to-GPU placement, and dispatch
// (Ops) to the CPU kernels.

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "../kernels/kernel_test_util.h"
#include "core/error.h"
#include "device/context.h"
#include "kernels/kernels.h"

namespace apiary::device {
namespace {

using apiary::testing::random_vec;

std::string message_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

TEST(DeviceKind, ParsesCpuAndCudaAndNamesTheKeyOtherwise) {
    EXPECT_EQ(parse_device("cpu", "train.device"), DeviceKind::cpu);
    EXPECT_EQ(parse_device("cuda", "train.device"), DeviceKind::cuda);
    EXPECT_THROW(parse_device("gpu", "train.device"), ConfigError);
    EXPECT_NE(message_of([] { parse_device("gpu", "train.device"); }).find("train.device = 'gpu'"),
              std::string::npos);
}

TEST(RequireDevice, CpuNeedsNothing) {
    int asked = 0;
    EXPECT_NO_THROW(require_device(DeviceKind::cpu, "train.device", [&] {
        ++asked;
        return CudaProbe{};
    }));
    EXPECT_EQ(asked, 0);
}

TEST(RequireDevice, CudaOnABuildWithoutCudaSaysSoAndNamesTheKey) {
    const std::string m = message_of(
        [] { require_device(DeviceKind::cuda, "train.device", [] { return CudaProbe{}; }); });
    EXPECT_NE(m.find("train.device = 'cuda'"), std::string::npos) << m;
    EXPECT_NE(m.find("built without the CUDA backend"), std::string::npos) << m;
    EXPECT_NE(m.find("APIARY_CUDA=ON"), std::string::npos) << m;
}

TEST(RequireDevice, CudaWithoutItsModuleSaysWhichFile) {
    const auto no_module = [] {
        return CudaProbe{true, 0, "apiary's CUDA module libapiary_cuda.so could not be loaded (x)",
                         true};
    };
    const std::string m =
        message_of([&] { require_device(DeviceKind::cuda, "train.device", no_module); });
    EXPECT_NE(m.find("train.device = 'cuda' but apiary's CUDA module libapiary_cuda.so could not "
                     "be loaded"),
              std::string::npos)
        << m;
}

TEST(RequireDevice, CudaWithoutAGpuQuotesTheRuntime) {
    const auto no_driver = [] { return CudaProbe{true, 0, "cudaErrorInsufficientDriver (...)"}; };
    const std::string m =
        message_of([&] { require_device(DeviceKind::cuda, "train.device", no_driver); });
    EXPECT_NE(m.find("no usable GPU"), std::string::npos) << m;
    EXPECT_NE(m.find("cudaErrorInsufficientDriver"), std::string::npos) << m;
    EXPECT_THROW(require_device(DeviceKind::cuda, "train.device",
                                [] {
                                    return CudaProbe{true, 0, ""};
                                }),
                 DeviceError);
    EXPECT_NO_THROW(require_device(DeviceKind::cuda, "train.device", [] {
        return CudaProbe{true, 1, ""};
    }));
}

// On this machine, whatever it is: the real probe and the real refusal agree.
TEST(RequireDevice, RealProbeAgreesWithThisBuildAndMachine) {
    const CudaProbe p = probe_cuda();
    EXPECT_EQ(p.built, cuda_built());
    if (!p.built || p.count == 0) {
        EXPECT_THROW(require_device(DeviceKind::cuda, "train.device"), DeviceError);
        EXPECT_THROW(DeviceContext::open(DeviceKind::cuda, 0), DeviceError);
    } else {
        EXPECT_NO_THROW(require_device(DeviceKind::cuda, "train.device"));
    }
}

TEST(GpuForRank, OneGpuPerLocalRank) {
    EXPECT_EQ(gpu_for_rank(0, 8), 0);
    EXPECT_EQ(gpu_for_rank(7, 8), 7);
    const std::string m = message_of([] { gpu_for_rank(2, 2); });
    EXPECT_NE(m.find("local rank 2"), std::string::npos) << m;
    EXPECT_THROW(gpu_for_rank(0, 0), DeviceError);
}

TEST(LocalRank, FromTheLaunchersEnvironment) {
    const char* saved = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    const std::string keep = saved ? saved : "";
    ::setenv("OMPI_COMM_WORLD_LOCAL_RANK", "3", 1);
    EXPECT_EQ(local_rank_from_env(), 3);
    ::setenv("OMPI_COMM_WORLD_LOCAL_RANK", "x1", 1);
    EXPECT_NE(message_of([] { local_rank_from_env(); }).find("OMPI_COMM_WORLD_LOCAL_RANK = 'x1'"),
              std::string::npos);
    if (saved) {
        ::setenv("OMPI_COMM_WORLD_LOCAL_RANK", keep.c_str(), 1);
    } else {
        ::unsetenv("OMPI_COMM_WORLD_LOCAL_RANK");
    }
}

TEST(DeviceArena, AccountsPerCategoryWithPeaks) {
    DeviceArena arena(host_allocator(1 << 20));
    {
        DeviceBuffer p = arena.allocate(1000, core::MemCategory::params, "wte");
        DeviceBuffer a = arena.allocate(3000, core::MemCategory::activations);
        EXPECT_NE(p.data(), nullptr);
        EXPECT_EQ(p.bytes(), 1000u);
        const core::MemStats s = arena.stats();
        EXPECT_EQ(s.current[int(core::MemCategory::params)], 1000);
        EXPECT_EQ(s.current[int(core::MemCategory::activations)], 3000);
        EXPECT_EQ(s.total_current, 4000);
        DeviceBuffer moved = std::move(a);  // ownership moves, the bytes are counted once
        EXPECT_EQ(arena.stats().total_current, 4000);
    }
    const core::MemStats s = arena.stats();
    EXPECT_EQ(s.total_current, 0);
    EXPECT_EQ(s.total_peak, 4000);
    EXPECT_EQ(s.peak[int(core::MemCategory::activations)], 3000);
    EXPECT_EQ(arena.allocations(), 2);
}

TEST(DeviceArena, OutOfMemoryNamesDeviceCategoryAndWhatIsHeld) {
    DeviceArena arena(host_allocator(10 << 20));
    DeviceBuffer held = arena.allocate(8 << 20, core::MemCategory::params, "blocks");
    const std::string m = message_of(
        [&] { arena.allocate(4 << 20, core::MemCategory::activations, "(B, T, C) residual"); });
    EXPECT_NE(m.find("host: out of memory allocating 4.00 MiB for activations ((B, T, C) "
                     "residual)"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("holds 8.00 MiB"), std::string::npos) << m;
    EXPECT_NE(m.find("2.00 MiB free"), std::string::npos) << m;
    EXPECT_THROW(arena.allocate(4 << 20, core::MemCategory::activations), OutOfMemoryError);
    EXPECT_EQ(arena.stats().total_current, 8 << 20);  // the failed requests left no trace
}

TEST(DeviceArena, NoAllocationAfterSeal) {
    DeviceArena arena(host_allocator(1 << 20));
    DeviceBuffer a = arena.allocate(64, core::MemCategory::grads);
    arena.seal();
    const std::string m = message_of([&] { arena.allocate(64, core::MemCategory::grads, "late"); });
    EXPECT_NE(m.find("after the step loop began"), std::string::npos) << m;
    EXPECT_EQ(arena.allocations(), 1);
}

TEST(DeviceContext, CpuContextRunsTheCpuKernels) {
    auto ctx = DeviceContext::open(DeviceKind::cpu, 0);
    EXPECT_EQ(ctx->kind(), DeviceKind::cpu);
    EXPECT_EQ(ctx->ops().name(), "cpu");
    EXPECT_EQ(ctx->describe(), "host");
}

// Dispatch: each Ops entry reaches its own kernel (a crossed wire, e.g.
// gelu_backward calling gelu_forward, gives other numbers).
TEST(CpuOps, EachEntryCallsItsKernel) {
    auto ops = cpu_ops();
    namespace k = apiary::kernels;
    const int N = 5, C = 19, M = 7, K = 11;
    const auto x = random_vec(N * C, 1), w = random_vec(C, 2), b = random_vec(C, 3),
               d = random_vec(N * C, 4);
    const auto A = random_vec(M * K, 5), B = random_vec(K * N, 6);
    const auto same = [](const std::vector<float>& u, const std::vector<float>& v) {
        return u.size() == v.size() && std::memcmp(u.data(), v.data(), u.size() * 4) == 0;
    };
    std::vector<float> c1(M * N), c2(M * N);
    ops->gemm(false, false, M, N, K, A.data(), K, B.data(), N, 0.0f, c1.data(), N);
    k::gemm(false, false, M, N, K, A.data(), K, B.data(), N, 0.0f, c2.data(), N);
    EXPECT_TRUE(same(c1, c2));

    std::vector<float> y1(N * C), y2(N * C), m1(N), m2(N), r1(N), r2(N);
    ops->layernorm_forward(y1.data(), m1.data(), r1.data(), x.data(), w.data(), b.data(), N, C,
                           1e-5f);
    k::layernorm_forward(y2.data(), m2.data(), r2.data(), x.data(), w.data(), b.data(), N, C,
                         1e-5f);
    EXPECT_TRUE(same(y1, y2) && same(r1, r2));

    std::vector<float> g1(N * C), g2(N * C), f(N * C);
    ops->gelu_backward(g1.data(), x.data(), d.data(), N * C);
    k::gelu_backward(g2.data(), x.data(), d.data(), N * C);
    k::gelu_forward(f.data(), x.data(), N * C);
    EXPECT_TRUE(same(g1, g2));
    EXPECT_FALSE(same(g1, f));

    std::vector<float> p1 = x, p2 = x, mm1(N * C, 0.f), mm2(N * C, 0.f), v1(N * C, 0.f),
                       v2(N * C, 0.f);
    ops->adamw_update(p1.data(), d.data(), mm1.data(), v1.data(), N * C, 1e-3f, 0.9f, 0.95f, 1e-8f,
                      0.1f, 3, 0.5f);
    k::adamw_update(p2.data(), d.data(), mm2.data(), v2.data(), N * C, 1e-3f, 0.9f, 0.95f, 1e-8f,
                    0.1f, 3, 0.5f);
    EXPECT_TRUE(same(p1, p2) && same(v1, v2));
    EXPECT_EQ(ops->sum_squares(x.data(), N * C), k::sum_squares(x.data(), N * C));
}

}  // namespace
}  // namespace apiary::device
