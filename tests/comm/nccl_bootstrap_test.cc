// NCCL's bootstrap without NCCL or a GPU: the unique id made on rank 0 only,
// carried to every rank over a host group (threads here, MPI in runs), and
// a failure on rank 0 reported on every rank instead of a hang.

#include "comm/nccl_bootstrap.h"

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>

#include "comm/thread_backend.h"
#include "core/error.h"

namespace apiary::comm {
namespace {

NcclId pattern(uint8_t seed) {
    NcclId id;
    for (size_t i = 0; i < id.size(); ++i) id[i] = uint8_t(seed + i * 7);
    return id;
}

TEST(NcclBootstrap, RankZeroMakesTheIdAndEveryRankGetsIt) {
    std::atomic<int> made{0};
    std::mutex mu;
    std::vector<NcclId> got(4);
    run_threads(4, [&](ProcessGroup& g) {
        const NcclId id = exchange_nccl_id(g, [&] {
            ++made;
            return pattern(uint8_t(40 + g.rank()));  // a wrong rank would give another id
        });
        std::lock_guard lock(mu);
        got[size_t(g.rank())] = id;
    });
    EXPECT_EQ(made.load(), 1);
    for (const NcclId& id : got) EXPECT_EQ(id, pattern(40));
}

TEST(NcclBootstrap, FailureOnRankZeroReachesEveryRank) {
    std::mutex mu;
    std::vector<std::string> errors(3);
    run_threads(3, [&](ProcessGroup& g) {
        try {
            exchange_nccl_id(
                g, []() -> NcclId { throw CommError("ncclGetUniqueId: no network interface"); });
        } catch (const CommError& e) {
            std::lock_guard lock(mu);
            errors[size_t(g.rank())] = e.what();
        }
    });
    EXPECT_EQ(errors[0], "ncclGetUniqueId: no network interface");  // rank 0's own
    for (int r = 1; r < 3; ++r) {
        EXPECT_NE(errors[size_t(r)].find("rank 0 could not create the NCCL unique id: "
                                         "ncclGetUniqueId: no network interface"),
                  std::string::npos)
            << errors[size_t(r)];
    }
}

}  // namespace
}  // namespace apiary::comm
