// The diagnosis line, the mesh layout checks and the DDP bucket helper.

#include "comm/forensics.h"

#include <gtest/gtest.h>

#include <atomic>
#include <nlohmann/json.hpp>
#include <thread>

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

// The sampled match check finds a mismatch some calls after it happened;
// the histories show where the ranks parted.
TEST(Diagnose, FindsTheEarliestMismatchInTheHistories) {
    GroupSnapshot a = waiting(0, ar(8, 3), 1), b = waiting(1, ar(8, 3), 1);
    a.recent = {ar(4, 4), ar(5, 5), ar(6, 6), ar(7, 7)};
    b.recent = {ar(4, 4), ar(5, 6), ar(6, 7), ar(7, 8)};
    const std::string msg = diagnose("dp", {a, b});
    EXPECT_EQ(msg,
              "dp: mismatch at #5: rank 0 calls all_reduce #5 bucket 5 (f32 x 1024) while rank 1 "
              "calls all_reduce #5 bucket 6 (f32 x 1024) (the ranks are now at #8); every rank "
              "must issue the same collectives in the same order");
}

TEST(Diagnose, DumpShowsTheLastCallsOfALongHistory) {
    GroupSnapshot s = waiting(2, ar(40, 0), 1.5);
    for (uint64_t k = 0; k < 40; ++k) s.recent.push_back(ar(k, int64_t(k)));
    const std::string line = dump_line("world", s);
    EXPECT_EQ(line.rfind("rank 2: recent world calls: (24 earlier), all_reduce #24 bucket 24", 0),
              0u)
        << line;
    EXPECT_NE(line.find("all_reduce #39 bucket 39 (f32 x 1024); waits in all_reduce #40"),
              std::string::npos)
        << line;
}

TEST(GroupMonitor, KeepsTheHistoryItIsAskedFor) {
    GroupMonitor small("world", {0, 1}, 0), big("world", {0, 1}, 0, 100);
    for (uint64_t k = 0; k < 150; ++k) {
        small.begin(ar(k, 0));
        small.end(ar(k, 0));
        big.begin(ar(k, 0));
        big.end(ar(k, 0));
    }
    EXPECT_EQ(small.snapshot().recent.size(), GroupMonitor::kMinHistory);
    const GroupSnapshot s = big.snapshot();
    ASSERT_EQ(s.recent.size(), 100u);
    EXPECT_EQ(s.recent.front().seq, 50u);
    EXPECT_EQ(s.last_done->seq, 149u);
    EXPECT_FALSE(s.in_flight.has_value());
}

// begin() and end() take no lock; a snapshot taken meanwhile must still see
// whole fingerprints (each written call has count == 2 * seq, tag id == seq).
TEST(GroupMonitor, SnapshotsDuringCallsAreConsistent) {
    GroupMonitor m("world", {0}, 0, 64);
    std::atomic<bool> stop{false};
    std::thread writer([&] {
        for (uint64_t k = 0; !stop; ++k) {
            const Fingerprint fp = ar(k, int64_t(k), int64_t(2 * k));
            m.begin(fp);
            m.end(fp);
        }
    });
    auto whole = [](const Fingerprint& fp) {
        return fp.count == int64_t(2 * fp.seq) && fp.tag.id == int64_t(fp.seq);
    };
    std::string torn;
    for (int i = 0; i < 20000 && torn.empty(); ++i) {
        const GroupSnapshot s = m.snapshot();
        if (s.in_flight && !whole(*s.in_flight)) torn = s.in_flight->describe();
        for (size_t k = 0; k < s.recent.size() && torn.empty(); ++k) {
            if (!whole(s.recent[k]) || (k > 0 && s.recent[k].seq != s.recent[k - 1].seq + 1)) {
                torn = s.recent[k].describe();
            }
        }
    }
    stop = true;
    writer.join();
    EXPECT_EQ(torn, "") << "a snapshot mixed two calls";
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
