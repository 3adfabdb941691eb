#include "ckpt/file_writer.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <thread>

#include "core/error.h"

namespace apiary::ckpt {

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

struct Counters {
    std::atomic<int64_t> total_ns{0}, write_ns{0}, hash_ns{0}, hash_wait_ns{0}, writeback_ns{0},
        wait_drop_ns{0}, sync_ns{0}, bytes{0}, files{0}, windowed_files{0};
};
Counters& counters() {
    static Counters c;
    return c;
}

// Adds the time since it was made to a counter.
class Timed {
  public:
    explicit Timed(std::atomic<int64_t>& to) : to_(to), t0_(Clock::now()) {}
    ~Timed() {
        to_ += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0_).count();
    }
    Timed(const Timed&) = delete;
    Timed& operator=(const Timed&) = delete;

  private:
    std::atomic<int64_t>& to_;
    Clock::time_point t0_;
};

double seconds(const std::atomic<int64_t>& ns) { return 1e-9 * double(ns.load()); }

void write_all(int fd, const void* p, size_t n, const std::string& path) {
    const char* c = static_cast<const char*>(p);
    while (n > 0) {
        const ssize_t w = ::write(fd, c, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            throw IoError(fmt::format("{}: write failed: {}", path, std::strerror(errno)));
        }
        c += w;
        n -= size_t(w);
    }
}

// The filesystem has no writeback for sync_file_range to start (tmpfs
// answers 0 and does nothing; others refuse): the writer goes on without.
bool unsupported(int err) {
    return err == EINVAL || err == ENOSYS || err == ESPIPE || err == EOPNOTSUPP;
}

// The digest of `parts` (see write_file_atomically).
struct Hasher {
    const FileParts& parts;
    size_t hash_parts_from;
    FileDigest digest;

    void run() {
        Timed t(counters().hash_ns);
        XXH64_state_t* state = XXH64_createState();
        XXH64_reset(state, 0);
        for (size_t i = 0; i < parts.size(); ++i) {
            const auto& [p, n] = parts[i];
            XXH64_update(state, p, n);
            if (i >= hash_parts_from) digest.tensors.push_back(XXH64(p, n, 0));
        }
        digest.xxh64 = XXH64_digest(state);
        XXH64_freeState(state);
    }
};

}  // namespace

WindowedWriter::WindowedWriter(int fd, std::string path, size_t window)
    : fd_(fd), path_(std::move(path)), window_(window) {
    APIARY_CHECK(window_ > 0, "WindowedWriter: window of 0 bytes for {}", path_);
}

void WindowedWriter::write(const void* p, size_t n) {
    // At most 8 MiB per call, cut at window ends: a window is whole when
    // its writeback starts.
    constexpr size_t kMaxWrite = size_t(8) << 20;
    const char* c = static_cast<const char*>(p);
    while (n > 0) {
        const size_t room = size_t(window_start_ + window_ - bytes_);
        const size_t len = std::min({n, room, kMaxWrite});
        {
            Timed t(counters().write_ns);
            write_all(fd_, c, len, path_);
        }
        c += len;
        n -= len;
        bytes_ += len;
        if (bytes_ == window_start_ + window_) window_done();
    }
}

void WindowedWriter::window_done() {
    const uint64_t start = window_start_;
    window_start_ += window_;
    if (!supported_) return;
    {
        Timed t(counters().writeback_ns);
        if (::sync_file_range(fd_, off_t(start), off_t(window_), SYNC_FILE_RANGE_WRITE) != 0) {
            if (unsupported(errno)) {
                supported_ = windowed_ = false;
                return;
            }
            throw IoError(
                fmt::format("{}: sync_file_range (starting writeback of bytes {}-{}) "
                            "failed: {}",
                            path_, start, start + window_, std::strerror(errno)));
        }
    }
    windowed_ = true;
    if (in_writeback_ >= 0) {
        // The previous window is on its way to the disk since this one
        // began: wait for it, then its pages are clean and can go.
        Timed t(counters().wait_drop_ns);
        const off_t prev = off_t(in_writeback_);
        if (::sync_file_range(fd_, prev, off_t(window_),
                              SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE |
                                  SYNC_FILE_RANGE_WAIT_AFTER) != 0) {
            throw IoError(
                fmt::format("{}: sync_file_range (waiting for writeback of bytes "
                            "{}-{}) failed: {}",
                            path_, prev, uint64_t(prev) + window_, std::strerror(errno)));
        }
        // Advice: a refusal leaves the pages cached, which costs memory,
        // not correctness.
        ::posix_fadvise(fd_, prev, off_t(window_), POSIX_FADV_DONTNEED);
    }
    in_writeback_ = int64_t(start);
}

WriteTimes write_times() {
    const Counters& c = counters();
    WriteTimes t;
    t.total_s = seconds(c.total_ns);
    t.write_s = seconds(c.write_ns);
    t.hash_s = seconds(c.hash_ns);
    t.hash_wait_s = seconds(c.hash_wait_ns);
    t.writeback_s = seconds(c.writeback_ns);
    t.wait_drop_s = seconds(c.wait_drop_ns);
    t.sync_s = seconds(c.sync_ns);
    t.bytes = c.bytes.load();
    t.files = c.files.load();
    t.windowed_files = c.windowed_files.load();
    return t;
}

void reset_write_times() {
    Counters& c = counters();
    for (auto* a : {&c.total_ns, &c.write_ns, &c.hash_ns, &c.hash_wait_ns, &c.writeback_ns,
                    &c.wait_drop_ns, &c.sync_ns, &c.bytes, &c.files, &c.windowed_files}) {
        a->store(0);
    }
}

FileDigest write_file_atomically(const std::string& path, const FileParts& parts,
                                 size_t hash_parts_from, size_t window) {
    Counters& ctr = counters();
    Timed all(ctr.total_ns);
    const fs::path target(path);
    const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
    // Unique per process and thread: ranks that write the same content-
    // addressed piece at once must not share a temporary file.
    const std::string tmp =
        (dir / fmt::format(".{}.{}.{:x}.tmp", target.filename().string(), long(::getpid()),
                           std::hash<std::thread::id>{}(std::this_thread::get_id())))
            .string();
    uint64_t total = 0;
    for (const auto& part : parts) total += part.second;
    Hasher hasher{parts, hash_parts_from, {}};
    hasher.digest.tensors.reserve(parts.size() > hash_parts_from ? parts.size() - hash_parts_from
                                                                 : 0);
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        throw IoError(fmt::format("{}: cannot create: {}", tmp, std::strerror(errno)));
    }
    bool windowed = false;
    try {
        // A large file is hashed from the caller's memory on a second
        // thread while this one writes (the parts do not change during the
        // call); a jthread is joined on every way out, errors included.
        std::jthread hashing;
        if (total >= window) {
            hashing = std::jthread([&hasher] { hasher.run(); });
        } else {
            hasher.run();
        }
        WindowedWriter w(fd, tmp, window);
        for (const auto& [p, n] : parts) w.write(p, n);
        windowed = w.windowed();
        if (hashing.joinable()) {
            Timed t(ctr.hash_wait_ns);
            hashing.join();
        }
        Timed t(ctr.sync_ns);
        if (::fsync(fd) != 0) {
            throw IoError(fmt::format("{}: fsync failed: {}", tmp, std::strerror(errno)));
        }
    } catch (...) {
        ::close(fd);
        ::unlink(tmp.c_str());
        throw;
    }
    FileDigest digest = std::move(hasher.digest);
    digest.bytes = total;
    Timed t(ctr.sync_ns);
    if (::close(fd) != 0) {
        const int err = errno;
        ::unlink(tmp.c_str());
        throw IoError(fmt::format("{}: close failed: {}", tmp, std::strerror(err)));
    }
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
        const int err = errno;
        ::unlink(tmp.c_str());
        throw IoError(fmt::format("{}: rename failed: {}", path, std::strerror(err)));
    }
    const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        ::fsync(dfd);
        ::close(dfd);
    }
    ctr.bytes += int64_t(total);
    ctr.files += 1;
    if (windowed) ctr.windowed_files += 1;
    return digest;
}

}  // namespace apiary::ckpt
