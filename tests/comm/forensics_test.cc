// The diagnosis line, the mesh layout checks and the DDP bucket helper.

#include "comm/forensics.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "comm/bucketed.h"
#include "comm/mesh.h"
#include "comm/thread_backend.h"
#include "core/error.h"

namespace apiary::comm {
namespace {

Fingerprint ar(uint64_t seq, int64_t bucket, int64_t count = 1024) {
    Fingerprint fp{CollOp::all_reduce, DType::f32, count, Tag{"bucket", bucket}};
    fp.seq = seq;
    return fp;
}

GroupSnapshot waiting(int rank, Fingerprint fp, double s) {
    GroupSnapshot g;
    g.world_rank = rank;
    g.in_flight = fp;
    g.in_flight_s = s;
    return g;
}

GroupSnapshot idle(int rank, Fingerprint last) {
    GroupSnapshot g;
    g.world_rank = rank;
    g.last_done = last;
    g.recent = {last};
    return g;
}

TEST(Diagnose, NamesTheRankThatIsBehind) {
    const std::string msg =
        diagnose("dp", {waiting(0, ar(1044, 8), 300), waiting(1, ar(1044, 8), 300),
                        waiting(2, ar(1044, 8), 299), idle(3, ar(1043, 7))});
    EXPECT_EQ(msg,
              "dp: rank 3 is at all_reduce #1043 bucket 7 (f32 x 1024) (completed; has not "
              "called #1044) while ranks 0-2 wait in all_reduce #1044 bucket 8 (f32 x 1024) for "
              "300.0 s");
}

TEST(Diagnose, ReportsDifferentCallsUnderOneSequenceNumber) {
    Fingerprint gather{CollOp::all_gather, DType::bf16, 512, Tag{}};
    gather.seq = 5;
    const std::string msg = diagnose(
        "world", {waiting(0, ar(5, 2), 1), waiting(1, gather, 1), waiting(2, ar(5, 2), 1)});
    EXPECT_NE(msg.find("mismatch at #5: ranks 0,2 call all_reduce #5 bucket 2 (f32 x 1024) while "
                       "rank 1 calls all_gather #5 (bf16 x 512)"),
              std::string::npos)
        << msg;
}

TEST(Diagnose, NamesRanksThatDidNotAnswer) {
    GroupSnapshot dead;
    dead.world_rank = 1;
    dead.answered = false;
    const std::string msg = diagnose("world", {waiting(0, ar(3, 0), 10), dead});
    EXPECT_NE(msg.find("rank 1 did not answer"), std::string::npos) << msg;
    EXPECT_NE(msg.find("all answering ranks wait in all_reduce #3"), std::string::npos) << msg;
}

TEST(Diagnose, SnapshotSurvivesJson) {
    GroupSnapshot s = waiting(4, ar(9, 3), 2.5);
    s.recent = {ar(7, 1), ar(8, 2)};
    const GroupSnapshot back = snapshot_from_json(nlohmann::json::parse(to_json(s).dump()));
    EXPECT_EQ(back.world_rank, 4);
    ASSERT_TRUE(back.in_flight.has_value());
    EXPECT_EQ(back.in_flight->describe(), "all_reduce #9 bucket 3 (f32 x 1024)");
    ASSERT_EQ(back.recent.size(), 2u);
    EXPECT_TRUE(back.recent[1].same_call(ar(8, 2)));
    EXPECT_EQ(dump_line("dp", back),
              "rank 4: recent dp calls: all_reduce #7 bucket 1 (f32 x 1024), all_reduce #8 "
              "bucket 2 (f32 x 1024); waits in all_reduce #9 bucket 3 (f32 x 1024) for 2.5 s");
}

TEST(FormatRanks, CompressesRuns) {
    EXPECT_EQ(format_ranks({0, 1, 2, 5, 7, 8}), "0-2,5,7,8");
    EXPECT_EQ(format_ranks({3}), "3");
}

TEST(Mesh, ProductMustMatchTheWorld) {
    try {
        resolve_mesh(8, 3, 2, 2, "tp,pp,dp");
        FAIL();
    } catch (const ConfigError& e) {
        EXPECT_NE(std::string(e.what()).find("tp(2) * pp(2) * dp(3) != world size 8"),
                  std::string::npos)
            << e.what();
    }
    EXPECT_THROW(resolve_mesh(8, 0, 3, 1, "tp,pp,dp"), ConfigError);
    EXPECT_THROW(resolve_mesh(8, 0, 2, 2, "tp,dp"), ConfigError);
    EXPECT_THROW(resolve_mesh(8, 0, 2, 2, "tp,tp,dp"), ConfigError);
    EXPECT_THROW(resolve_mesh(8, 0, 2, 2, "tp,xp,dp"), ConfigError);
    EXPECT_EQ(resolve_mesh(8, 0, 2, 2, "dp, tp, pp").dp, 2);
}

TEST(Mesh, CoordinatesFollowTheAxisOrder) {
    const MeshShape s = resolve_mesh(12, 3, 2, 2, "tp,pp,dp");
    // tp varies fastest: ranks 0 and 1 differ only in tp.
    EXPECT_EQ(coord_of(s, 1).tp, 1);
    EXPECT_EQ(coord_of(s, 2).pp, 1);
    EXPECT_EQ(coord_of(s, 4).dp, 1);
    for (int r = 0; r < 12; ++r) EXPECT_EQ(rank_of(s, coord_of(s, r)), r);
    const MeshShape d = resolve_mesh(12, 3, 2, 2, "dp,tp,pp");
    EXPECT_EQ(coord_of(d, 1).dp, 1);
    EXPECT_EQ(d.describe(), "dp(3) * tp(2) * pp(2)");
}

TEST(Buckets, PackWholeParameters) {
    const auto b = make_buckets({100, 200, 50, 1000, 10}, 300 * sizeof(float));
    ASSERT_EQ(b.size(), 4u);
    EXPECT_EQ(b[0].offset, 0);
    EXPECT_EQ(b[0].count, 300);
    EXPECT_EQ(b[1].offset, 300);
    EXPECT_EQ(b[1].count, 50);
    EXPECT_EQ(b[2].count, 1000);
    EXPECT_EQ(b[3].offset, 1350);
}

TEST(Buckets, AllReduceEachBucketAsItBecomesReady) {
    run_threads(3, [](ProcessGroup& g) {
        const auto buckets = make_buckets({40, 40, 40, 25}, 64 * sizeof(float));
        std::vector<float> grads(145);
        BucketedAllReduce ddp(g, grads.data(), buckets);
        for (int step = 0; step < 2; ++step) {
            for (size_t i = 0; i < grads.size(); ++i) grads[i] = float(g.rank() * 3 + step);
            // Backward order: the last bucket is complete first.
            for (int b = ddp.num_buckets() - 1; b >= 0; --b) ddp.mark_ready(b);
            ddp.finish();
            for (float x : grads) ASSERT_EQ(x, float(3 + step));  // mean over ranks 0..2
        }
    });
}

TEST(Buckets, UnmarkedBucketIsAnError) {
    run_threads(1, [](ProcessGroup& g) {
        std::vector<float> grads(10);
        BucketedAllReduce ddp(g, grads.data(), make_buckets({5, 5}, 5 * sizeof(float)));
        ddp.mark_ready(1);
        EXPECT_THROW(ddp.finish(), CommError);
    });
}

}  // namespace
}  // namespace apiary::comm
