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
    std::atomic<int64_t> total_ns{0}, copy_hash_ns{0}, wait_ns{0}, file_hash_ns{0}, write_ns{0},
        writeback_ns{0}, sync_ns{0}, bytes{0}, files{0}, direct_files{0};
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

}  // namespace

WriteTimes write_times() {
    const Counters& c = counters();
    WriteTimes t;
    t.total_s = seconds(c.total_ns);
    t.copy_hash_s = seconds(c.copy_hash_ns);
    t.wait_s = seconds(c.wait_ns);
    t.file_hash_s = seconds(c.file_hash_ns);
    t.write_s = seconds(c.write_ns);
    t.writeback_s = seconds(c.writeback_ns);
    t.sync_s = seconds(c.sync_ns);
    t.bytes = c.bytes.load();
    t.files = c.files.load();
    t.direct_files = c.direct_files.load();
    return t;
}

void reset_write_times() {
    Counters& c = counters();
    for (auto* a : {&c.total_ns, &c.copy_hash_ns, &c.wait_ns, &c.file_hash_ns, &c.write_ns, &c.writeback_ns,
                    &c.sync_ns, &c.bytes, &c.files, &c.direct_files}) {
        a->store(0);
    }
}

FileDigest write_file_atomically(const std::string& path, const FileParts& parts,
                                 size_t hash_parts_from) {
    Counters& ctr = counters();
    Timed all(ctr.total_ns);
    XXH64_state_t* state = XXH64_createState();
    XXH64_state_t* part_state = XXH64_createState();
    XXH64_reset(state, 0);
    FileDigest digest;
    const fs::path target(path);
    const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
    // Unique per process and thread: ranks that write the same content-
    // addressed piece at once must not share a temporary file.
    const std::string tmp =
        (dir / fmt::format(".{}.{}.{:x}.tmp", target.filename().string(), long(::getpid()),
                           std::hash<std::thread::id>{}(std::this_thread::get_id())))
            .string();
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        throw IoError(fmt::format("{}: cannot create: {}", tmp, std::strerror(errno)));
    }
    try {
        // In blocks, each hashed while it is still in cache; every 64 MiB
        // the kernel is told to start writing the last window back, so the
        // disk works while later blocks are copied and the final fsync has
        // little left to do (one big write then one fsync ran at about half
        // of dd's rate here).
        constexpr size_t kBlock = size_t(4) << 20, kWindow = size_t(64) << 20;
        size_t flushed = 0;
        for (size_t i = 0; i < parts.size(); ++i) {
            const auto& [p, n] = parts[i];
            const bool own = i >= hash_parts_from;
            if (own) XXH64_reset(part_state, 0);
            const char* c = static_cast<const char*>(p);
            for (size_t at = 0; at < n; at += kBlock) {
                const size_t len = std::min(kBlock, n - at);
                {
                    Timed t(ctr.write_ns);
                    write_all(fd, c + at, len, tmp);
                }
                {
                    Timed t(ctr.copy_hash_ns);
                    XXH64_update(state, c + at, len);
                    if (own) XXH64_update(part_state, c + at, len);
                }
                digest.bytes += len;
                if (digest.bytes - flushed >= kWindow) {
                    Timed t(ctr.writeback_ns);
                    ::sync_file_range(fd, off_t(flushed), off_t(digest.bytes - flushed),
                                      SYNC_FILE_RANGE_WRITE);
                    flushed = digest.bytes;
                }
            }
            if (own) digest.tensors.push_back(XXH64_digest(part_state));
        }
        Timed t(ctr.sync_ns);
        if (::fsync(fd) != 0) {
            throw IoError(fmt::format("{}: fsync failed: {}", tmp, std::strerror(errno)));
        }
    } catch (...) {
        XXH64_freeState(state);
        XXH64_freeState(part_state);
        ::close(fd);
        ::unlink(tmp.c_str());
        throw;
    }
    digest.xxh64 = XXH64_digest(state);
    XXH64_freeState(state);
    XXH64_freeState(part_state);
    ::close(fd);
    Timed t(ctr.sync_ns);
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
        ::unlink(tmp.c_str());
        throw IoError(fmt::format("{}: rename failed: {}", path, std::strerror(errno)));
    }
    const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
    if (dfd >= 0) {
        ::fsync(dfd);
        ::close(dfd);
    }
    ctr.bytes += int64_t(digest.bytes);
    ctr.files += 1;
    return digest;
}

}  // namespace apiary::ckpt
