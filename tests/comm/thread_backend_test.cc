// Every collective on the thread backend (ranks as threads), for 1 to 4 ranks.

#include "comm/thread_backend.h"

#include <gtest/gtest.h>

#include <thread>

#include "collective_checks.h"
#include "core/error.h"

namespace apiary::comm {
namespace {

using namespace testing;

class ThreadCollectives : public ::testing::TestWithParam<int> {};

TEST_P(ThreadCollectives, AllReduceF32SumAndAvg) {
    run_threads(GetParam(), [](ProcessGroup& g) {
        check_all_reduce(g, DType::f32, ReduceOp::sum, 1001);
        check_all_reduce(g, DType::f32, ReduceOp::avg, 1001);
    });
}

TEST_P(ThreadCollectives, AllReduceBf16SumsInF32) {
    run_threads(GetParam(), [](ProcessGroup& g) {
        check_all_reduce(g, DType::bf16, ReduceOp::sum, 517);
        check_all_reduce(g, DType::bf16, ReduceOp::avg, 517);
    });
}

TEST_P(ThreadCollectives, ReduceScatterAndAllGather) {
    run_threads(GetParam(), [](ProcessGroup& g) {
        for (DType dt : {DType::f32, DType::bf16}) {
            check_reduce_scatter(g, dt, false, 33);
            check_reduce_scatter(g, dt, true, 33);
            check_all_gather(g, dt, false, 33);
            check_all_gather(g, dt, true, 33);
        }
    });
}

TEST_P(ThreadCollectives, BroadcastAllToAllSendRecv) {
    run_threads(GetParam(), [](ProcessGroup& g) {
        check_broadcast(g, g.size() - 1, 65);
        check_all_to_all(g, 9);
        check_all_to_all_v(g);
        check_send_recv_ring(g, 129);
        g.barrier()->wait();
    });
}

TEST_P(ThreadCollectives, ManyOutstandingCallsCompleteInIssueOrder) {
    run_threads(GetParam(), [](ProcessGroup& g) { check_many_outstanding(g); });
}

INSTANTIATE_TEST_SUITE_P(Ranks, ThreadCollectives, ::testing::Values(1, 2, 3, 4));

TEST(ThreadMesh, EveryAxisOrderSplitsTheRightRanks) {
    run_threads(8, [](ProcessGroup& g) {
        check_mesh(g, 2, 2, 2, "tp,pp,dp");
        check_mesh(g, 2, 2, 2, "dp,tp,pp");
        check_mesh(g, 0, 4, 1, "pp,dp,tp");
    });
}

TEST(ThreadBackend, F16ReductionIsRejected) {
    EXPECT_THROW(run_threads(2,
                             [](ProcessGroup& g) {
                                 uint16_t x = 0;
                                 g.all_reduce(&x, 1, DType::f16, ReduceOp::sum);
                             }),
                 CommError);
}

TEST(ThreadBackend, StalledRankIsNamedWhenTheOthersTimeOut) {
    std::string message;
    try {
        run_threads(
            3,
            [](ProcessGroup& g) {
                float x = 1;
                g.all_reduce(&x, 1, DType::f32, ReduceOp::sum, Tag{"bucket", 6})->wait();
                if (g.rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(600));
                g.all_reduce(&x, 1, DType::f32, ReduceOp::sum, Tag{"bucket", 7})->wait();
            },
            ThreadWorldOptions{0.2, true});
        FAIL() << "no timeout";
    } catch (const CommError& e) {
        message = e.what();
    }
    EXPECT_NE(message.find("rank 1 is at all_reduce #0 bucket 6"), std::string::npos) << message;
    EXPECT_NE(message.find("ranks 0,2 wait in all_reduce #1 bucket 7"), std::string::npos)
        << message;
}

TEST(ThreadBackend, SkippedCollectiveIsReportedAsMismatch) {
    std::string message;
    try {
        run_threads(2, [](ProcessGroup& g) {
            float x = 1;
            if (g.rank() == 0) g.all_reduce(&x, 1, DType::f32, ReduceOp::sum, Tag{"bucket", 0});
            g.all_reduce(&x, 1, DType::f32, ReduceOp::sum, Tag{"bucket", 1})->wait();
        });
        FAIL() << "no mismatch found";
    } catch (const CommError& e) {
        message = e.what();
    }
    EXPECT_NE(message.find("mismatch at #0"), std::string::npos) << message;
    EXPECT_NE(message.find("rank 0 calls all_reduce #0 bucket 0"), std::string::npos) << message;
    EXPECT_NE(message.find("rank 1 calls all_reduce #0 bucket 1"), std::string::npos) << message;
}

TEST(ThreadBackend, DifferentCountsAreReportedAsMismatch) {
    try {
        run_threads(2, [](ProcessGroup& g) {
            std::vector<float> x(8, 1.0f);
            g.all_reduce(x.data(), 4 + g.rank(), DType::f32, ReduceOp::sum)->wait();
        });
        FAIL() << "no mismatch found";
    } catch (const CommError& e) {
        EXPECT_NE(std::string(e.what()).find("(f32 x 5)"), std::string::npos) << e.what();
    }
}

TEST(ThreadBackend, ConfigHashMismatchNamesTheRank) {
    try {
        run_threads(
            3, [](ProcessGroup& g) { check_config_hash(g, g.rank() == 2 ? 0xbadull : 0x600dull); });
        FAIL() << "no mismatch found";
    } catch (const CommError& e) {
        EXPECT_NE(std::string(e.what()).find("rank 2 has config hash 0000000000000bad but "
                                             "rank 0 has 000000000000600d"),
                  std::string::npos)
            << e.what();
    }
    run_threads(3, [](ProcessGroup& g) { check_config_hash(g, 42); });
}

}  // namespace
}  // namespace apiary::comm
