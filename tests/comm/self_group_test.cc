// The group of one rank that stands for every axis a layout does not split:
// each collective is the identity, point to point is refused, and a mesh of
// one rank is made of such groups.
#include "comm/self_group.h"

#include <gtest/gtest.h>

#include <vector>

#include "comm/mesh.h"
#include "core/error.h"

using apiary::comm::DType;
using apiary::comm::ReduceOp;
using apiary::comm::SelfGroup;

TEST(SelfGroup, CollectivesOfOneRankAreTheIdentity) {
    SelfGroup g("world", 0);
    EXPECT_EQ(g.size(), 1);
    EXPECT_EQ(g.rank(), 0);
    std::vector<float> x = {1.5f, -2.0f, 3.25f};
    g.all_reduce(x.data(), 3, DType::f32, ReduceOp::sum)->wait();
    g.all_reduce(x.data(), 3, DType::f32, ReduceOp::avg)->wait();
    EXPECT_EQ(x, (std::vector<float>{1.5f, -2.0f, 3.25f}));
    std::vector<float> out(3, 0.0f);
    g.reduce_scatter(x.data(), out.data(), 3, DType::f32, ReduceOp::sum)->wait();
    EXPECT_EQ(out, x);
    std::fill(out.begin(), out.end(), 0.0f);
    g.all_gather(x.data(), out.data(), 3, DType::f32)->wait();
    EXPECT_EQ(out, x);
    std::fill(out.begin(), out.end(), 0.0f);
    g.all_to_all(x.data(), out.data(), 3, DType::f32)->wait();
    EXPECT_EQ(out, x);
    std::fill(out.begin(), out.end(), 0.0f);
    g.all_to_all_v(x.data(), {3}, out.data(), {3}, DType::f32)->wait();
    EXPECT_EQ(out, x);
    EXPECT_THROW(g.all_to_all_v(x.data(), {3}, out.data(), {2}, DType::f32), apiary::CommError);
    // In place (send is recv's own block) leaves the data as it is.
    g.all_gather(x.data(), x.data(), 3, DType::f32)->wait();
    EXPECT_EQ(x, (std::vector<float>{1.5f, -2.0f, 3.25f}));
    int64_t n = 7;
    g.all_reduce(&n, 1, DType::i64, ReduceOp::max)->wait();
    g.broadcast(&n, 1, DType::i64, 0)->wait();
    g.barrier()->wait();
    EXPECT_EQ(n, 7);
    // Every call gets the next sequence number, as in the real backends.
    EXPECT_EQ(g.barrier()->fingerprint().seq, 10u);
}

TEST(SelfGroup, RefusesWhatNoBackendAccepts) {
    SelfGroup g("dp", 3);
    float x = 1.0f;
    EXPECT_THROW(g.send(&x, 1, DType::f32, 0), apiary::CommError);
    EXPECT_THROW(g.recv(&x, 1, DType::f32, 0), apiary::CommError);
    EXPECT_THROW(g.broadcast(&x, 1, DType::f32, 1), apiary::CommError);
    int64_t n = 1;
    EXPECT_THROW(g.all_reduce(&n, 1, DType::i64, ReduceOp::avg), apiary::CommError);
    try {
        g.send(&x, 1, DType::f32, 0);
    } catch (const apiary::CommError& e) {
        EXPECT_NE(std::string(e.what()).find("dp"), std::string::npos) << e.what();
    }
}

TEST(SelfGroup, SplitsIntoGroupsOfOneAndMakesAOneRankMesh) {
    auto world = std::make_shared<SelfGroup>("world", 0);
    EXPECT_EQ(world->split(-1, 0, "none"), nullptr);
    auto sub = world->split(5, 0, "tp");
    ASSERT_NE(sub, nullptr);
    EXPECT_EQ(sub->size(), 1);
    EXPECT_EQ(sub->name(), "tp");
    EXPECT_EQ(sub->world_ranks(), std::vector<int>{0});
    apiary::comm::MeshShape shape;
    apiary::comm::DeviceMesh mesh(world, shape);
    EXPECT_EQ(mesh.dp().size(), 1);
    EXPECT_EQ(mesh.tp().size(), 1);
    EXPECT_EQ(mesh.pp().size(), 1);
}
