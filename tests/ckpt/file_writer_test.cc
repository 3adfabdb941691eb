// The checkpoint file writer: every byte lands where it belongs whatever
// the sizes of the parts against the writeback windows, on a disk and on
// tmpfs (which has no writeback to start); the digest is the file's; a
// large file leaves at most two windows in the page cache; a failed write
// leaves the previous file and no temporary one.

#include "ckpt/file_writer.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/magic.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/statfs.h>
#include <unistd.h>
#include <xxhash.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"

namespace apiary::ckpt {
namespace {

namespace fs = std::filesystem;

// Small windows so that a test crosses many of them in little time; a
// multiple of the page size, as the writer expects.
constexpr size_t kWindow = size_t(64) << 10;

// Bytes that differ at every offset (a misplaced block shows).
std::vector<char> pattern(size_t n, uint32_t seed) {
    std::vector<char> v(n);
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; ++i) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        v[i] = char(x);
    }
    return v;
}

std::vector<char> read_all(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Temporary files the writer left in `dir` (named `.<name>.<pid>.<id>.tmp`).
std::vector<std::string> leftovers(const fs::path& dir) {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir)) {
        const std::string name = e.path().filename().string();
        if (name.ends_with(".tmp")) out.push_back(name);
    }
    return out;
}

// The filesystem of `dir`, when it is one whose page cache the writer
// cannot empty: tmpfs (the cache is the file) or overlayfs (a container's
// layer: sync_file_range reaches the overlay, not the file below, whose
// dirty pages then stay).
const char* undroppable_fs(const fs::path& dir) {
    struct statfs s {};
    if (::statfs(dir.c_str(), &s) != 0) return nullptr;
    if (s.f_type == TMPFS_MAGIC) return "tmpfs";
    if (s.f_type == OVERLAYFS_SUPER_MAGIC) return "overlayfs";
    return nullptr;
}

// A folder on the disk the tests are built on (the temporary directory may
// be tmpfs), or on /dev/shm.
class FileWriter : public ::testing::TestWithParam<const char*> {
  protected:
    void SetUp() override {
        const std::string where = GetParam();
        const fs::path base = where == "shm" ? fs::path("/dev/shm") : fs::path(APIARY_BINARY_DIR);
        if (!fs::is_directory(base)) GTEST_SKIP() << base << " does not exist here";
        dir_ = base / ("apiary_file_writer_" + std::to_string(::getpid()));
        fs::create_directories(dir_);
    }
    void TearDown() override {
        if (!dir_.empty()) fs::remove_all(dir_);
    }
    fs::path dir_;
};

TEST_P(FileWriter, ContentIsByteExactAroundWindowEnds) {
    for (const size_t n :
         {size_t(0), size_t(1), kWindow - 1, kWindow, kWindow + 1, 5 * kWindow + 4097}) {
        SCOPED_TRACE("file of " + std::to_string(n) + " bytes");
        const std::vector<char> bytes = pattern(n, uint32_t(n));
        // Three parts whose ends fall anywhere against the windows: a
        // third, a window's worth less 3 (when there is room), the rest.
        const size_t a = n / 3, b = std::min(n - a, kWindow - 3);
        const FileParts parts = {
            {bytes.data(), a}, {bytes.data() + a, b}, {bytes.data() + a + b, n - a - b}};
        const fs::path path = dir_ / "shard.safetensors";
        const FileDigest d = write_file_atomically(path.string(), parts, 1, kWindow);
        EXPECT_EQ(read_all(path), bytes);
        EXPECT_EQ(d.bytes, n);
        EXPECT_EQ(d.xxh64, XXH64(bytes.data(), n, 0));
        ASSERT_EQ(d.tensors.size(), 2u);
        EXPECT_EQ(d.tensors[0], XXH64(bytes.data() + a, b, 0));
        EXPECT_EQ(d.tensors[1], XXH64(bytes.data() + a + b, n - a - b, 0));
        EXPECT_TRUE(leftovers(dir_).empty());
    }
}

TEST_P(FileWriter, ReplacesAnEarlierFile) {
    const fs::path path = dir_ / "latest";
    const std::vector<char> old_bytes = pattern(3 * kWindow, 1), new_bytes = pattern(7, 2);
    write_file_atomically(path.string(), {{old_bytes.data(), old_bytes.size()}}, SIZE_MAX, kWindow);
    write_file_atomically(path.string(), {{new_bytes.data(), new_bytes.size()}}, SIZE_MAX, kWindow);
    EXPECT_EQ(read_all(path), new_bytes);
}

// mincore on a mapping of the written file: pages of it still in the page
// cache. Without the drops every page of a freshly written file is there.
TEST_P(FileWriter, KeepsAtMostTwoWindowsInThePageCache) {
    if (const char* fs_name = undroppable_fs(dir_)) {
        GTEST_SKIP() << dir_ << " is on " << fs_name << ": the writer cannot drop its pages there";
    }
    const size_t n = 16 * kWindow;
    const std::vector<char> bytes = pattern(n, 3);
    const fs::path path = dir_ / "big.safetensors";
    const int64_t windowed_before = write_times().windowed_files;
    write_file_atomically(path.string(), {{bytes.data(), n}}, SIZE_MAX, kWindow);
    if (write_times().windowed_files == windowed_before) {
        GTEST_SKIP() << "the filesystem of " << dir_
                     << " refused sync_file_range: the writer wrote without windows";
    }
    const int fd = ::open(path.c_str(), O_RDONLY);
    ASSERT_GE(fd, 0);
    void* map = ::mmap(nullptr, n, PROT_READ, MAP_SHARED, fd, 0);
    ::close(fd);
    ASSERT_NE(map, MAP_FAILED);
    const size_t page = size_t(::sysconf(_SC_PAGESIZE));
    std::vector<unsigned char> resident((n + page - 1) / page);
    ASSERT_EQ(::mincore(map, n, resident.data()), 0) << std::strerror(errno);
    ::munmap(map, n);
    size_t pages = 0;
    for (unsigned char r : resident) pages += r & 1;
    EXPECT_LE(pages * page, 2 * kWindow)
        << pages << " pages of " << resident.size() << " are in the page cache";
}

// RLIMIT_FSIZE stands in for a full disk: write() fails with EFBIG
// (SIGXFSZ ignored) past the limit, as it would with ENOSPC.
TEST_P(FileWriter, AFailedWriteNamesTheFileAndLeavesThePreviousOne) {
    const fs::path path = dir_ / "rank_00000.safetensors";
    const std::vector<char> old_bytes = pattern(1000, 4), new_bytes = pattern(6 * kWindow, 5);
    write_file_atomically(path.string(), {{old_bytes.data(), old_bytes.size()}}, SIZE_MAX, kWindow);
    rlimit saved{};
    ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
    rlimit small = saved;
    small.rlim_cur = 2 * kWindow + 100;
    const auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
    ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
    std::string message;
    try {
        write_file_atomically(path.string(), {{new_bytes.data(), new_bytes.size()}}, SIZE_MAX,
                              kWindow);
    } catch (const IoError& e) {
        message = e.what();
    }
    ::setrlimit(RLIMIT_FSIZE, &saved);
    ::signal(SIGXFSZ, old_handler);
    EXPECT_NE(message.find("rank_00000.safetensors"), std::string::npos) << message;
    EXPECT_NE(message.find("write failed"), std::string::npos) << message;
    EXPECT_EQ(read_all(path), old_bytes);
    EXPECT_TRUE(leftovers(dir_).empty()) << leftovers(dir_).front();
}

TEST_P(FileWriter, AMissingFolderIsNamed) {
    const fs::path path = dir_ / "no_such_step" / "manifest.json";
    try {
        write_file_atomically(path.string(), {{"{}", 2}});
        FAIL() << "wrote into a folder that does not exist";
    } catch (const IoError& e) {
        EXPECT_NE(std::string(e.what()).find("no_such_step"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("cannot create"), std::string::npos) << e.what();
    }
}

INSTANTIATE_TEST_SUITE_P(Disk, FileWriter, ::testing::Values("disk"));
INSTANTIATE_TEST_SUITE_P(Tmpfs, FileWriter, ::testing::Values("shm"));

// The writer itself, on a descriptor, fed in writes that straddle the
// window ends: the file and the byte count are the bytes written.
TEST(WindowedWriter, SmallWritesAcrossWindowEnds) {
    const fs::path path =
        fs::path(APIARY_BINARY_DIR) / ("apiary_windowed_" + std::to_string(::getpid()));
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ASSERT_GE(fd, 0);
    const std::vector<char> bytes = pattern(3 * kWindow + 5, 6);
    WindowedWriter w(fd, path.string(), kWindow);
    for (size_t at = 0; at < bytes.size(); at += 1000) {
        w.write(bytes.data() + at, std::min<size_t>(1000, bytes.size() - at));
    }
    EXPECT_EQ(w.bytes(), bytes.size());
    ::close(fd);
    EXPECT_EQ(read_all(path), bytes);
    fs::remove(path);
}

// Where sync_file_range is refused (a pipe answers ESPIPE, as a filesystem
// without writeback answers EINVAL) the writer goes on with plain writes.
TEST(WindowedWriter, GoesOnWithoutWindowsWhereSyncFileRangeIsRefused) {
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    const size_t window = size_t(::sysconf(_SC_PAGESIZE));
    const std::vector<char> bytes = pattern(5 * window + 3, 7);
    std::vector<char> got;
    std::thread reader([&] {
        char buf[4096];
        for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;)
            got.insert(got.end(), buf, buf + n);
    });
    WindowedWriter w(fds[1], "a pipe", window);
    w.write(bytes.data(), bytes.size());
    ::close(fds[1]);
    reader.join();
    ::close(fds[0]);
    EXPECT_FALSE(w.windowed());
    EXPECT_EQ(got, bytes);
}

}  // namespace
}  // namespace apiary::ckpt
