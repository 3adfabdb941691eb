// The MPI backend under mpirun (label dist): every collective, the mesh,
// hierarchical against flat all-reduce, DDP buckets, the config-hash check.
// Every rank runs every test; only rank 0 prints; the exit code is non-zero
// if any rank failed.

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <random>

#include "collective_checks.h"
#include "comm/bucketed.h"
#include "comm/buffer.h"
#include "comm/mpi_backend.h"
#include "core/allocator.h"
#include "core/error.h"

namespace apiary::comm {
namespace {

using namespace testing;

std::shared_ptr<ProcessGroup> g_world;
ProcessGroup& world() { return *g_world; }

TEST(Mpi, AllReduce) {
    for (DType dt : {DType::f32, DType::bf16}) {
        for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
            check_all_reduce(world(), dt, op, 1);
            check_all_reduce(world(), dt, op, 100003);
            check_all_reduce(world(), dt, op, (int64_t(33) << 20) / 4 + 3);  // ring path
        }
    }
}

TEST(Mpi, ReduceScatterAndAllGather) {
    for (DType dt : {DType::f32, DType::bf16}) {
        for (bool in_place : {false, true}) {
            check_reduce_scatter(world(), dt, in_place, 4099);
            check_all_gather(world(), dt, in_place, 4099);
            check_reduce_scatter(world(), dt, in_place, (int64_t(5) << 20) / 4 / 2 + 1);  // ring
        }
    }
}

// A reduce-scatter far larger than a piece (ZeRO's 154 MB GPT-2 embedding
// unit, say) runs in pieces: its result is exact, and the scratch its group
// allocates, reserved ahead and then used, is bounded by the piece
// (kCollectivePieceBytes: a bf16 piece widened to f32, and the ring's two
// chunks of one piece), not by the message.
TEST(Mpi, LargeReduceScatterScratchIsBoundedByThePiece) {
    // A group of its own: a fresh engine, whose scratch nothing has grown yet.
    auto g = world().split(0, world().rank(), "pieces");
    ASSERT_TRUE(g);
    const int n = g->size();
    if (n == 1) GTEST_SKIP() << "one rank has no ring";
    // Per rank; not a whole number of pieces, so the last one is short.
    const int64_t count = 2 * kCollectivePieceBytes / 4 + 7;
    const int64_t bound = kCollectivePieceBytes + 2 * kCollectivePieceBytes / n + 2 * 4096;
    // The scratch sized by the message (two of its blocks for the ring, the
    // whole message widened) would break the bound.
    ASSERT_GT(2 * count * 4, bound);
    const auto buffers = [] {
        return core::mem_stats().current[size_t(core::MemCategory::buffers)];
    };
    const int64_t before = buffers();
    for (DType dt : {DType::f32, DType::bf16}) {
        g->reserve_scratch(CollOp::reduce_scatter, count, dt);
        const int64_t reserved = buffers() - before;
        for (bool in_place : {false, true}) check_reduce_scatter(*g, dt, in_place, count);
        EXPECT_EQ(buffers() - before, reserved) << "the calls needed more than was reserved";
        EXPECT_GT(reserved, 0);
        EXPECT_LE(reserved, bound) << core::dtype_name(dt);
    }
}

TEST(Mpi, BroadcastAllToAllSendRecvBarrier) {
    check_broadcast(world(), world().size() - 1, 1000);
    check_broadcast(world(), 0, 3);
    check_all_to_all(world(), 257);
    check_all_to_all_v(world());
    check_send_recv_ring(world(), 300000);  // past the eager limit: rendezvous protocol
    world().barrier()->wait();
}

TEST(Mpi, ManyOutstandingCalls) { check_many_outstanding(world()); }

TEST(Mpi, Mesh) {
    const int n = world().size();
    check_mesh(world(), n, 1, 1, "tp,pp,dp");
    if (n % 2 == 0) {
        check_mesh(world(), 0, 2, 1, "tp,pp,dp");
        check_mesh(world(), 0, 1, 2, "dp,tp,pp");
    }
    if (n == 4) check_mesh(world(), 1, 2, 2, "pp,tp,dp");
}

// Flat and hierarchical all-reduce of the same inputs, on a group that
// pretends to be `nodes` nodes. Integer inputs: both must be bit-identical.
// Random inputs: the summation order differs, so within f32 rounding.
void compare_flat_and_hierarchical(int nodes) {
    auto h = world().split(0, world().rank(), "world_h");
    set_hierarchical(*h, true, nodes);
    for (int64_t count : {int64_t(1), int64_t(7), int64_t(100001)}) {
        std::vector<float> flat(static_cast<size_t>(count)), hier(static_cast<size_t>(count));
        for (int64_t i = 0; i < count; ++i)
            flat[size_t(i)] = float((world().rank() + 3) * (i % 11));
        hier = flat;
        world().all_reduce(flat.data(), count, DType::f32, ReduceOp::sum)->wait();
        h->all_reduce(hier.data(), count, DType::f32, ReduceOp::sum)->wait();
        EXPECT_EQ(flat, hier) << "count " << count << " nodes " << nodes;

        std::mt19937 rng(uint32_t(world().rank() * 7919 + count));
        std::normal_distribution<float> normal;
        for (auto& x : flat) x = normal(rng);
        hier = flat;
        world().all_reduce(flat.data(), count, DType::f32, ReduceOp::avg)->wait();
        h->all_reduce(hier.data(), count, DType::f32, ReduceOp::avg)->wait();
        for (int64_t i = 0; i < count; ++i) {
            // 4 f32 terms: each order is within a few ulps of the exact sum.
            ASSERT_NEAR(flat[size_t(i)], hier[size_t(i)], 1e-6f * (1 + std::abs(flat[size_t(i)])));
        }
        std::vector<uint16_t> b16(static_cast<size_t>(count), 0x3f80);  // 1.0 in bf16
        h->all_reduce(b16.data(), count, DType::bf16, ReduceOp::sum)->wait();
        float one_each;
        bf16_to_f32(&b16[0], &one_each, 1);
        EXPECT_EQ(one_each, float(world().size()));
    }
}

TEST(Mpi, HierarchicalEqualsFlat) {
    compare_flat_and_hierarchical(1);
    if (world().size() % 2 == 0) compare_flat_and_hierarchical(2);
    compare_flat_and_hierarchical(world().size());
}

TEST(Mpi, HierarchicalNodesHintMustDivideTheGroup) {
    if (world().size() % 3 == 0) GTEST_SKIP() << "needs a size not divisible by 3";
    auto h = world().split(0, world().rank(), "world_h");
    EXPECT_THROW(set_hierarchical(*h, true, 3), ConfigError);
}

TEST(Mpi, BucketedAllReduce) {
    std::vector<float> grads(50000);
    BucketedAllReduce ddp(world(), grads.data(),
                          make_buckets({10000, 20000, 15000, 5000}, 64 << 10));
    for (int step = 0; step < 3; ++step) {
        for (size_t i = 0; i < grads.size(); ++i) grads[i] = float(world().rank() + step + i % 3);
        for (int b = ddp.num_buckets() - 1; b >= 0; --b) ddp.mark_ready(b);
        ddp.finish();
        const float mean_rank = float(world().size() - 1) / 2;
        for (size_t i = 0; i < grads.size(); ++i) {
            ASSERT_EQ(grads[i], mean_rank + float(step + i % 3));
        }
    }
}

TEST(Mpi, ConfigHash) {
    check_config_hash(world(), 1234);
    // Both ranks throw, and agree on the message's subject.
    try {
        check_config_hash(world(), world().rank() == world().size() - 1 ? 1 : 2);
        if (world().size() > 1) FAIL() << "no mismatch found";
    } catch (const CommError& e) {
        EXPECT_NE(
            std::string(e.what()).find(fmt::format("rank {} has config hash", world().size() - 1)),
            std::string::npos)
            << e.what();
    }
}

}  // namespace
}  // namespace apiary::comm

int main(int argc, char** argv) {
    ::testing::InitGoogleTest(&argc, argv);
    int rc = 0;
    {
        apiary::comm::CommOptions options;
        options.timeout_s = 120;
        apiary::comm::MpiSession session(options);
        apiary::comm::g_world = session.world();
        // Set by launchers' tests (srun, sbatch): a 2-rank job must be one
        // world, not two singletons.
        if (const char* want = std::getenv("APIARY_EXPECT_WORLD_SIZE")) {
            if (session.world()->size() != std::atoi(want)) {
                std::fprintf(stderr, "world size %d, expected %s\n", session.world()->size(), want);
                return 1;
            }
        }
        if (session.world()->rank() != 0) {
            auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
            delete listeners.Release(listeners.default_result_printer());
        }
        rc = RUN_ALL_TESTS();
        int any = rc;
        MPI_Allreduce(&rc, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        rc = any;
        apiary::comm::g_world.reset();
    }
    return rc;
}
