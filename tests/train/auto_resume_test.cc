// --auto-resume's policy (train::auto_resume_policy) on run directories in
// each state a requeued job can find.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>

#include "train/trainer.h"

namespace apiary::train {
namespace {

namespace fs = std::filesystem;

class AutoResumeTest : public ::testing::Test {
  protected:
    void SetUp() override {
        dir_ = fs::temp_directory_path() /
               ("apiary-auto-resume-" + std::to_string(::getpid()) + "-" +
                ::testing::UnitTest::GetInstance()->current_test_info()->name());
        fs::remove_all(dir_);
    }
    void TearDown() override { fs::remove_all(dir_); }
    void touch(const fs::path& p) {
        fs::create_directories(p.parent_path());
        std::ofstream(p) << "{}";
    }
    fs::path dir_;
};

TEST_F(AutoResumeTest, NoDirectoryIsANewRun) {
    const AutoResume a = auto_resume_policy(dir_.string());
    EXPECT_FALSE(a.resume);
    EXPECT_FALSE(a.overwrite);
}

TEST_F(AutoResumeTest, KilledBeforeItsFirstSaveStartsAgain) {
    touch(dir_ / "config.toml");
    fs::create_directories(dir_ / "ckpt" / "step_00000005");  // a partial save: no manifest
    const AutoResume a = auto_resume_policy(dir_.string());
    EXPECT_FALSE(a.resume);
    EXPECT_TRUE(a.overwrite);
}

TEST_F(AutoResumeTest, ACheckpointWithoutLatestIsResumedFrom) {
    touch(dir_ / "ckpt" / "step_00000005" / "manifest.json");
    const AutoResume a = auto_resume_policy(dir_.string());
    EXPECT_TRUE(a.resume);
    EXPECT_TRUE(a.previous_good);
    EXPECT_FALSE(a.overwrite);
}

TEST_F(AutoResumeTest, ALatestIsResumedFromWithFallback) {
    touch(dir_ / "ckpt" / "latest");
    const AutoResume a = auto_resume_policy(dir_.string());
    EXPECT_TRUE(a.resume);
    EXPECT_TRUE(a.previous_good);
}

}  // namespace
}  // namespace apiary::train
