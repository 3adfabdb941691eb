// The safetensors reader against hostile files: every length it reads is
// checked against the format's limit and the file before anything is
// allocated for it, and shapes whose byte count overflows are named.

#include "ckpt/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.h"

namespace apiary::ckpt {
namespace {

namespace fs = std::filesystem;

class Hostile : public ::testing::Test {
  protected:
    void SetUp() override {
        dir_ = fs::temp_directory_path() / ("apiary_st_" + std::to_string(::getpid()));
        fs::create_directories(dir_);
    }
    void TearDown() override { fs::remove_all(dir_); }
    // A file of an 8-byte length, then `rest`, padded with spaces to `size`.
    fs::path file(const std::string& name, uint64_t hlen, const std::string& rest,
                  size_t size = 0) {
        const fs::path p = dir_ / name;
        std::string bytes(8, '\0');
        std::memcpy(bytes.data(), &hlen, 8);
        bytes += rest;
        if (bytes.size() < size) bytes.resize(size, ' ');
        std::ofstream(p, std::ios::binary) << bytes;
        return p;
    }
    // The IoError message of opening `p` (header only, and whole).
    static std::string error_of(const fs::path& p, bool header_only) {
        try {
            SafetensorsFile f(p.string(), header_only);
        } catch (const IoError& e) {
            return e.what();
        }
        ADD_FAILURE() << p << " was accepted";
        return "";
    }
    fs::path dir_;
};

TEST_F(Hostile, AHugeHeaderLengthIsNamedWithTheLimitBeforeReading) {
    const fs::path p = file("huge.safetensors", 6000000000ull, "{}", 100);
    for (bool header_only : {true, false}) {
        const std::string msg = error_of(p, header_only);
        EXPECT_NE(msg.find(p.string() + ": "), std::string::npos) << msg;
        EXPECT_NE(msg.find("declares 6000000000 bytes"), std::string::npos) << msg;
        EXPECT_NE(msg.find("limit is 104857600 bytes"), std::string::npos) << msg;
        EXPECT_NE(msg.find("92 bytes after the length"), std::string::npos) << msg;
    }
}

TEST_F(Hostile, AHeaderOverTheFormatsLimitIsRefusedEvenWhenTheFileHoldsIt) {
    // A sparse file larger than the declared header: only the limit stops it.
    const uint64_t hlen = kMaxHeaderBytes + 1;
    const fs::path p = file("big.safetensors", hlen, "{");
    fs::resize_file(p, hlen + 16);
    const std::string msg = error_of(p, true);
    EXPECT_NE(msg.find("declares 104857601 bytes, but that is over the limit"), std::string::npos)
        << msg;
}

TEST_F(Hostile, AShapeWhoseByteCountOverflowsIsNamed) {
    // 2^31 * 2^31 * 4 bytes wraps to 0 in 64 bits: data_offsets [0, 0] matched it.
    const std::string header =
        R"({"w":{"dtype":"F32","shape":[2147483648,2147483648],"data_offsets":[0,0]}})";
    const fs::path p = file("overflow.safetensors", header.size(), header);
    const std::string msg = error_of(p, false);
    EXPECT_NE(msg.find("tensor 'w': shape [2147483648, 2147483648] of F32"), std::string::npos)
        << msg;
    EXPECT_NE(msg.find("more than 2^63 bytes"), std::string::npos) << msg;
    uint64_t bytes = 0;
    EXPECT_FALSE(tensor_bytes({int64_t(1) << 31, int64_t(1) << 31}, 4, bytes));
    EXPECT_FALSE(tensor_bytes({3, -1}, 4, bytes));
    ASSERT_TRUE(tensor_bytes({3, 5}, 2, bytes));
    EXPECT_EQ(bytes, 30u);
}

TEST_F(Hostile, ASymlinkToADeviceIsNotARegularFile) {
    const fs::path p = dir_ / "dev.safetensors";
    fs::create_symlink("/dev/null", p);
    const std::string msg = error_of(p, true);
    EXPECT_NE(msg.find(p.string() + ": not a regular file"), std::string::npos) << msg;
}

}  // namespace
}  // namespace apiary::ckpt
