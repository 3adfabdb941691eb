// The NCCL group on one GPU (a lent machine has one): a group of one rank
// must run every collective as the identity, pass its watchdog, verify its
// fingerprints over the host group and split. Without a GPU (or NCCL) the
// tests report themselves skipped.

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <vector>

#include "comm/nccl_backend.h"
#include "comm/self_group.h"
#include "core/error.h"
#include "device/device.h"

namespace apiary::comm {
namespace {

class NcclOnOneGpu : public ::testing::Test {
  protected:
    void SetUp() override {
        if (device::probe_cuda().count == 0) GTEST_SKIP() << "no GPU here";
        ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
        ASSERT_EQ(cudaStreamCreate(&stream_), cudaSuccess);
        NcclOptions o;
        o.verify = true;
        o.timeout_s = 60;
        group_ = make_nccl_group(std::make_shared<SelfGroup>("world"), stream_, o);
    }
    void TearDown() override {
        group_.reset();
        if (stream_) cudaStreamDestroy(stream_);
    }
    float* device_copy(const std::vector<float>& v) {
        float* d = nullptr;
        EXPECT_EQ(cudaMalloc(&d, v.size() * sizeof(float)), cudaSuccess);
        EXPECT_EQ(cudaMemcpy(d, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice),
                  cudaSuccess);
        bufs_.push_back(d);
        return d;
    }
    std::vector<float> host_copy(const float* d, size_t n) {
        std::vector<float> v(n);
        EXPECT_EQ(cudaMemcpy(v.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
        return v;
    }
    ~NcclOnOneGpu() override {
        for (float* b : bufs_) cudaFree(b);
    }
    cudaStream_t stream_ = nullptr;
    std::shared_ptr<ProcessGroup> group_;
    std::vector<float*> bufs_;
};

TEST_F(NcclOnOneGpu, CollectivesOfOneRankAreTheIdentity) {
    const std::vector<float> x = {1.5f, -2.0f, 3.25f, 7.0f, -0.5f};
    float* a = device_copy(x);
    group_->all_reduce(a, 5, DType::f32, ReduceOp::sum)->wait();
    group_->all_reduce(a, 5, DType::f32, ReduceOp::avg)->wait();
    group_->broadcast(a, 5, DType::f32, 0)->wait();
    EXPECT_EQ(host_copy(a, 5), x);
    float* g = device_copy(std::vector<float>(5, 0.0f));
    group_->all_gather(a, g, 5, DType::f32)->wait();
    EXPECT_EQ(host_copy(g, 5), x);
    float* r = device_copy(std::vector<float>(5, 0.0f));
    group_->reduce_scatter(a, r, 5, DType::f32, ReduceOp::sum)->wait();
    EXPECT_EQ(host_copy(r, 5), x);
    float* t = device_copy(std::vector<float>(5, 0.0f));
    group_->all_to_all(a, t, 5, DType::f32)->wait();
    EXPECT_EQ(host_copy(t, 5), x);
    auto w = group_->barrier();
    w->wait();
    EXPECT_TRUE(w->test());
}

// Where there is no GPU (CI), the group cannot be made, and says so with an
// error naming NCCL or the GPU rather than a crash or a hang.
TEST(NcclBackend, WithoutAGpuRefusesClearly) {
    if (device::probe_cuda().count > 0) GTEST_SKIP() << "a GPU is here: see NcclOnOneGpu";
    auto self = std::make_shared<SelfGroup>();
    try {
        make_nccl_group(self, nullptr);
        ADD_FAILURE() << "an NCCL group without a GPU";
    } catch (const Error& e) {
        const std::string m = e.what();
        EXPECT_TRUE(m.find("NCCL") != std::string::npos || m.find("CUDA") != std::string::npos)
            << m;
    }
}

TEST_F(NcclOnOneGpu, SplitGivesAGroupOfOne) {
    auto sub = group_->split(0, 0, "dp");
    ASSERT_NE(sub, nullptr);
    EXPECT_EQ(sub->size(), 1);
    float* a = device_copy({4.0f, 5.0f});
    sub->all_reduce(a, 2, DType::f32, ReduceOp::sum)->wait();
    EXPECT_EQ(host_copy(a, 2), (std::vector<float>{4.0f, 5.0f}));
    EXPECT_EQ(group_->split(-1, 0, "none"), nullptr);
}

}  // namespace
}  // namespace apiary::comm
