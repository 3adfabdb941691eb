// `apiary launch`: the command it builds (--dry-run), and a real 2-rank run.

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace {

struct Result {
    int code = -1;
    std::string out;
};

Result apiary(const std::string& args) {
    const std::string cmd =
        std::string("timeout 120 ") + APIARY_BINARY_DIR + "/apiary " + args + " 2>&1";
    Result r;
    FILE* p = popen(cmd.c_str(), "r");
    if (!p) return r;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
    const int status = pclose(p);
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return r;
}

TEST(Launch, DryRunBuildsTheMpirunCommand) {
    const Result r = apiary("launch --dry-run --launcher mpirun -n 4 -- config show --set a.b=1");
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_EQ(r.out.rfind("mpirun -n 4 -x OMP_NUM_THREADS=1 ", 0), 0u) << r.out;
    EXPECT_NE(r.out.find("/apiary config show --set a.b=1\n"), std::string::npos) << r.out;
}

TEST(Launch, DryRunPassesThreadsAndLauncherArgs) {
    const Result r = apiary(
        "launch --dry-run --launcher mpirun -n 1 -t 3 --launcher-arg "
        "--tag-output -- config show");
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("-x OMP_NUM_THREADS=3"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(" --tag-output "), std::string::npos) << r.out;
}

TEST(Launch, DryRunWithSrun) {
    const Result r = apiary("launch --dry-run --launcher srun -n 2 -t 2 -- config show");
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_EQ(r.out.rfind("env OMP_NUM_THREADS=2 srun -n 2 --cpus-per-task=2 "
                          "--kill-on-bad-exit=1 ",
                          0),
              0u)
        << r.out;
}

TEST(Launch, NothingToRunIsAnError) {
    const Result r = apiary("launch -n 2");
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_NE(r.out.find("launch: nothing to run"), std::string::npos) << r.out;
}

}  // namespace
