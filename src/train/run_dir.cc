#include "train/run_dir.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "ckpt/safetensors.h"
#include "core/error.h"

namespace apiary::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// What a run writes at the top of its directory; --overwrite removes these.
const char* const kRunEntries[] = {"config.toml", kMetricsFile, "tokenizer.json",
                                   "ckpt",        "logs",       "trace"};

bool empty_but_lock(const fs::path& dir) {
    for (const auto& e : fs::directory_iterator(dir)) {
        if (e.path().filename() != kLockFile) return false;
    }
    return true;
}

// True when `inner` is `outer` or lies inside it (both canonical).
bool contains(const fs::path& outer, const fs::path& inner) {
    auto o = outer.begin(), i = inner.begin();
    for (; o != outer.end(); ++o, ++i) {
        if (i == inner.end() || *o != *i) return false;
    }
    return true;
}

}  // namespace

void check_new_run_dir(const std::string& dir, bool overwrite) {
    if (dir.empty()) throw ConfigError("run.dir is empty");
    if (!fs::exists(dir)) return;
    if (!fs::is_directory(dir)) {
        throw ConfigError(fmt::format("run.dir '{}' exists and is not a directory", dir));
    }
    if (empty_but_lock(dir)) return;
    if (!overwrite) {
        throw ConfigError(
            fmt::format("run.dir '{}' already holds a run; pick another with "
                        "--set run.dir=PATH, continue it with --resume {}, or pass "
                        "--overwrite to replace it",
                        dir, dir));
    }
    const fs::path here = fs::weakly_canonical(fs::current_path());
    const fs::path target = fs::weakly_canonical(dir);
    if (contains(target, here)) {
        throw ConfigError(
            fmt::format("--overwrite: run.dir '{}' is the working directory or "
                        "holds it ({}); refusing to remove it",
                        dir, here.string()));
    }
    const fs::path p(dir);
    if (!fs::is_regular_file(p / "config.toml") || !fs::is_regular_file(p / kMetricsFile)) {
        throw ConfigError(
            fmt::format("--overwrite: '{}' is not an apiary run directory (it has "
                        "no config.toml and metrics.jsonl); refusing to remove "
                        "its files: pick another run.dir",
                        dir));
    }
}

void clear_run_dir(const std::string& dir) {
    for (const char* name : kRunEntries) fs::remove_all(fs::path(dir) / name);
}

RunDirLock::RunDirLock(const std::string& dir) {
    fs::create_directories(dir);
    const std::string path = (fs::path(dir) / kLockFile).string();
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) {
        throw IoError(
            fmt::format("{}: cannot open the run's lock file: {}", path, std::strerror(errno)));
    }
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
        const int err = errno;
        std::string pid, host;
        std::ifstream(path) >> pid >> host;
        ::close(fd_);
        fd_ = -1;
        if (err != EWOULDBLOCK) {
            throw IoError(fmt::format("{}: cannot lock: {}", path, std::strerror(err)));
        }
        throw ConfigError(fmt::format(
            "run.dir '{}' is in use by another apiary process (pid {}{}, "
            "from {}); wait for it to finish or stop it first",
            dir, pid.empty() ? "unknown" : pid, host.empty() ? "" : " on host " + host, path));
    }
    char host[256] = "";
    ::gethostname(host, sizeof(host) - 1);
    const std::string who = fmt::format("{} {}\n", ::getpid(), host);
    if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, who.data(), who.size(), 0) < 0) {
        // The lock holds without the pid; the message then says "unknown".
    }
}

RunDirLock::~RunDirLock() {
    if (fd_ >= 0) ::close(fd_);  // releases the flock
}

int64_t truncate_metrics(const std::string& dir, int64_t step) {
    const fs::path path = fs::path(dir) / kMetricsFile;
    std::ifstream in(path);
    if (!in) return 0;
    std::string kept, line;
    int64_t dropped = 0;
    while (std::getline(in, line)) {
        if (in.eof()) {  // no newline: a torn last line
            ++dropped;
            break;
        }
        const json j = json::parse(line, nullptr, false);
        const bool later = !j.is_object() || !j.contains("step") ||
                           !j["step"].is_number_integer() || j["step"].get<int64_t>() > step;
        if (later) {
            ++dropped;
            continue;
        }
        kept += line;
        kept += '\n';
    }
    if (dropped > 0) ckpt::atomic_write(path.string(), kept.data(), kept.size());
    return dropped;
}

MetricsLog::MetricsLog(const std::string& path, bool append) : path_(path) {
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | (append ? 0 : O_TRUNC), 0644);
    if (fd_ < 0) {
        throw IoError(fmt::format("{}: cannot open for writing: {}", path, std::strerror(errno)));
    }
    const off_t end = ::lseek(fd_, 0, SEEK_END);
    good_size_ = end < 0 ? 0 : int64_t(end);
}

MetricsLog::~MetricsLog() {
    if (fd_ >= 0) ::close(fd_);
}

void MetricsLog::write(const json& record) {
    const std::string line = record.dump() + "\n";
    size_t done = 0;
    int err = 0;
    ::lseek(fd_, off_t(good_size_), SEEK_SET);
    while (done < line.size()) {
        const ssize_t n = ::write(fd_, line.data() + done, line.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            err = n < 0 ? errno : ENOSPC;
            break;
        }
        done += size_t(n);
    }
    if (err == 0) {
        good_size_ += int64_t(line.size());
        if (torn_ && ::ftruncate(fd_, off_t(good_size_)) == 0) torn_ = false;
        return;
    }
    // Cut the torn line off so that the file stays one object per line.
    // If that fails too, the next successful write overwrites the fragment
    // from good_size_ and cuts what is left of it.
    torn_ = ::ftruncate(fd_, off_t(good_size_)) != 0;
    ++lost_;
    fmt::print(stderr,
               "apiary: warning: {}: write failed ({}): the record of step {} is lost; training "
               "goes on and later records are written once there is room ({} lost so far)\n",
               path_, std::strerror(err), record.value("step", int64_t(-1)), lost_);
}

}  // namespace apiary::train
