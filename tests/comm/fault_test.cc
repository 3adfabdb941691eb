// Hang forensics end to end (label dist): a job with one misbehaving rank
// must end, non-zero, within the timeout plus a margin, with a message that
// names the rank and the collective. The margin is enforced by `timeout`
// (exit 124 fails the test), not by a clock in the test.

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace {

struct Result {
    int code = -1;
    std::string output;
};

// 2 s comm.timeout_s + 10 s side-channel exchange + start-up, generously.
Result run(int np, const std::string& scenario) {
    const std::string cmd = std::string("timeout 60 ") + MPIRUN + " -n " + std::to_string(np) +
                            " " + FAULT_DRIVER + " " + scenario + " 2>&1";
    Result r;
    FILE* p = popen(cmd.c_str(), "r");
    if (!p) return r;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.output.append(buf, n);
    const int status = pclose(p);
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return r;
}

bool has(const Result& r, const std::string& s) { return r.output.find(s) != std::string::npos; }

// A scenario that must end the job non-zero, before `timeout` kills it.
Result failing(int np, const std::string& scenario) {
    Result r = run(np, scenario);
    EXPECT_NE(r.code, 0) << r.output;
    EXPECT_NE(r.code, 124) << "the job hung\n" << r.output;
    return r;
}

TEST(Faults, HealthyJobExitsZero) {
    const Result r = run(2, "ok");
    EXPECT_EQ(r.code, 0) << r.output;
}

TEST(Faults, StalledRankIsNamed) {
    const Result r = failing(4, "stall");
    EXPECT_TRUE(has(r,
                    "rank 3 is at all_reduce #6 bucket 5 (f32 x 1024) (completed; has not "
                    "called #7) while ranks 0-2 wait in all_reduce #7 bucket 6"))
        << r.output;
    EXPECT_TRUE(has(r, "exceeded comm.timeout_s = 2 s")) << r.output;
    // Every rank dumps its recent calls.
    for (int rank = 0; rank < 4; ++rank) {
        EXPECT_TRUE(has(r, "apiary: rank " + std::to_string(rank) + ": recent world calls:"))
            << r.output;
    }
}

TEST(Faults, SkippedCollectiveIsAMismatch) {
    const Result r = failing(2, "skip");
    EXPECT_TRUE(has(r,
                    "mismatch at #6: rank 0 calls all_reduce #6 bucket 5 (f32 x 1024) while "
                    "rank 1 calls all_reduce #6 bucket 6 (f32 x 1024)"))
        << r.output;
}

// Without the check the ranks meet at the final barrier, where rank 1 (one
// call short) faces rank 0's last all-reduce and the watchdog fires; the
// histories then show where they parted.
TEST(Faults, SkippedCollectiveWithoutMatchCheckIsFoundAtTheEnd) {
    const Result r = failing(2, "skip_noverify");
    EXPECT_TRUE(has(r,
                    "mismatch at #6: rank 0 calls all_reduce #6 bucket 5 (f32 x 1024) while "
                    "rank 1 calls all_reduce #6 bucket 6 (f32 x 1024) (the ranks are now at #10)"))
        << r.output;
}

// Past the first 256 calls the check samples (every 64th call) and covers
// the calls since the last one: a wrong bucket at #301 runs (MPI cannot tell)
// and is named at #320, the next check.
TEST(Faults, LateMismatchIsFoundAtTheNextSampledCheck) {
    const Result r = failing(2, "late_tag");
    EXPECT_TRUE(has(r, "ranks called different collectives (found by rank")) << r.output;
    EXPECT_TRUE(has(r,
                    "world: mismatch at #301: rank 0 calls all_reduce #301 bucket 0 (f32 x 1024) "
                    "while rank 1 calls all_reduce #301 bucket 1 (f32 x 1024) (the ranks are now "
                    "at #320)"))
        << r.output;
}

TEST(Faults, LateSkippedCollectiveIsFoundAtTheNextSampledCheck) {
    const Result r = failing(2, "late_skip");
    EXPECT_TRUE(has(r,
                    "mismatch at #301: rank 0 calls all_reduce #301 bucket 0 (f32 x 1024) "
                    "while rank 1 calls all_reduce #301 bucket 1 (f32 x 1024)"))
        << r.output;
}

// A different count between sampled checks: MPI itself fails the call
// (truncation) on the rank that receives too much, and the message says what
// that usually means.
TEST(Faults, LateDifferentCountEndsTheJobAtTheCall) {
    const Result r = failing(2, "late_count");
    EXPECT_TRUE(has(r, "all_reduce #301 bucket 0")) << r.output;
    EXPECT_TRUE(has(r, "different counts") || has(r, "mismatch at #301")) << r.output;
}

TEST(Faults, DifferentCountIsAMismatch) {
    const Result r = failing(2, "count");
    EXPECT_TRUE(has(r, "rank 1 calls all_reduce #4 bucket 3 (f32 x 1025)")) << r.output;
}

TEST(Faults, DeadRankEndsTheJob) {
    const Result r = failing(2, "die");
    EXPECT_TRUE(has(r, "rank 1")) << r.output;
}

TEST(Faults, ErrorOnOneRankIsPrintedAndEndsTheJob) {
    const Result r = failing(2, "throw");
    EXPECT_TRUE(has(r, "apiary: error: shard_0007.bin: truncated at byte 4096")) << r.output;
    EXPECT_FALSE(has(r, "mismatch")) << r.output;
}

TEST(Faults, ConfigMismatchIsReported) {
    const Result r = run(2, "config");
    EXPECT_NE(r.code, 0) << r.output;
    EXPECT_TRUE(has(r, "config differs between ranks: rank 1 has config hash")) << r.output;
}

// `apiary launch -n 2` really starts two ranks (each prints the config).
TEST(LaunchDist, RunsEveryRank) {
    const std::string cmd = std::string("timeout 120 ") + APIARY_BINARY_DIR +
                            "/apiary launch --launcher mpirun -n 2 -- config show "
                            "--set comm.timeout_s=7 2>&1";
    std::string out;
    FILE* p = popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
    EXPECT_EQ(pclose(p), 0) << out;
    size_t copies = 0;
    for (size_t pos = out.find("timeout_s = 7"); pos != std::string::npos;
         pos = out.find("timeout_s = 7", pos + 1)) {
        ++copies;
    }
    EXPECT_EQ(copies, 2u) << out;
}

}  // namespace
