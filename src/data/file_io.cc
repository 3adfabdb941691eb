#include "data/file_io.h"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>

#include "core/error.h"

namespace apiary::data {

std::string unusable_input(const std::string& path) {
    namespace fs = std::filesystem;
    std::error_code ec;
    const auto st = fs::status(path, ec);
    if (ec || !fs::exists(st)) return "does not exist";
    if (fs::is_directory(st)) return "is a directory";
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return fmt::format("is not readable: {}", std::strerror(errno));
    bool empty = false;
    if (fs::is_regular_file(st)) {
        empty = fs::file_size(path, ec) == 0;
    } else {
        char byte;  // a device or pipe: does it give anything? (/dev/null does not)
        empty = ::read(fd, &byte, 1) == 0;
    }
    ::close(fd);
    if (empty) return "is empty";
    if (!fs::is_regular_file(st)) {
        return "is not a regular file (a device or pipe would be read more than once: write it "
               "to a file first)";
    }
    return "";
}

namespace {

// The whole of path read through one descriptor (a pipe too); past
// max_bytes, throws what too_big() makes.
template <typename TooBig>
std::string read_fd_bounded(const std::string& path, uint64_t max_bytes, TooBig too_big) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        throw IoError(fmt::format("cannot open '{}': {}", path, std::strerror(errno)));
    }
    std::string out;
    char buf[1 << 16];
    for (;;) {
        const ssize_t n = ::read(fd, buf, sizeof(buf));
        if (n < 0) {
            if (errno == EINTR) continue;
            const int e = errno;
            ::close(fd);
            throw IoError(
                fmt::format("cannot read '{}' at byte {}: {}", path, out.size(), std::strerror(e)));
        }
        if (n == 0) break;
        out.append(buf, static_cast<size_t>(n));
        if (out.size() > max_bytes) {
            ::close(fd);
            throw too_big();
        }
    }
    ::close(fd);
    return out;
}

}  // namespace

std::string read_file(const std::string& path, uint64_t max_bytes, const char* what) {
    namespace fs = std::filesystem;
    std::error_code ec;
    const auto st = fs::status(path, ec);
    if (fs::is_character_file(st) || fs::is_block_file(st) || fs::is_directory(st)) {
        throw IoError(
            fmt::format("{} '{}' is not a regular file (a device or directory, or a "
                        "symlink to one): give the file itself",
                        what, path));
    }
    auto too_big = [&](const std::string& size) {
        return IoError(
            fmt::format("{} '{}' has {} bytes, more than the {} bytes a {} may have: "
                        "not a {}, or damaged",
                        what, path, size, max_bytes, what, what));
    };
    if (fs::is_regular_file(st)) {
        const uint64_t size = fs::file_size(path, ec);
        if (!ec && size > max_bytes) throw too_big(std::to_string(size));
    }
    // A pipe has no size: it is read up to the bound.
    return read_fd_bounded(path, max_bytes,
                           [&] { return too_big("more than " + std::to_string(max_bytes)); });
}

std::string read_file(const std::string& path) {
    return read_fd_bounded(path, std::numeric_limits<uint64_t>::max(), [] { return IoError(""); });
}

void write_file_atomic(const std::string& path, std::string_view data) {
    const std::string tmp = path + ".tmp";
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        throw IoError(fmt::format("cannot create '{}': {}", tmp, std::strerror(errno)));
    }
    size_t done = 0;
    while (done < data.size()) {
        const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
        if (n < 0) {
            if (errno == EINTR) continue;
            const int e = errno;
            ::close(fd);
            throw IoError(
                fmt::format("cannot write '{}' at byte {}: {}", tmp, done, std::strerror(e)));
        }
        done += static_cast<size_t>(n);
    }
    if (::fsync(fd) != 0 || ::close(fd) != 0) {
        throw IoError(fmt::format("cannot flush '{}': {}", tmp, std::strerror(errno)));
    }
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
        throw IoError(
            fmt::format("cannot rename '{}' to '{}': {}", tmp, path, std::strerror(errno)));
    }
    // The rename itself is durable only once the directory is synced.
    const auto parent = std::filesystem::path(path).parent_path();
    const std::string dir = parent.empty() ? std::string(".") : parent.string();
    const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        ::fsync(dfd);
        ::close(dfd);
    }
}

uint64_t xxhash64(const void* data, size_t n, uint64_t seed) { return XXH64(data, n, seed); }

uint64_t xxhash64_file(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw IoError(fmt::format("cannot open '{}': {}", path, std::strerror(errno)));
    XXH64_state_t* st = XXH64_createState();
    XXH64_reset(st, 0);
    std::string buf(1 << 20, '\0');
    for (;;) {
        const ssize_t n = ::read(fd, buf.data(), buf.size());
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            const int e = errno;
            XXH64_freeState(st);
            ::close(fd);
            throw IoError(fmt::format("cannot read '{}': {}", path, std::strerror(e)));
        }
        if (n == 0) break;
        XXH64_update(st, buf.data(), static_cast<size_t>(n));
    }
    const uint64_t h = XXH64_digest(st);
    XXH64_freeState(st);
    ::close(fd);
    return h;
}

std::string hex64(uint64_t h) { return fmt::format("{:016x}", h); }

}  // namespace apiary::data
