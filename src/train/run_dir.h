#pragma once
// The run directory: who may use it, what --overwrite may remove, and the
// metrics log, which must never be left with a broken line.
//
//   <run>/config.toml     the resolved config
//   <run>/metrics.jsonl   one JSON object per logged step and per evaluation
//   <run>/tokenizer.json  what `apiary generate` decodes with
//   <run>/ckpt/           checkpoints (train/checkpoint.h)
//   <run>/logs/           one log per rank
//   <run>/.lock           flock'ed by the process that trains in it; holds its pid

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace apiary::train {

constexpr const char* kMetricsFile = "metrics.jsonl";
constexpr const char* kLockFile = ".lock";

// Throws ConfigError unless `dir` may hold a new run: absent, empty (but for
// a lock file), or, with overwrite, recognisably an apiary run (config.toml
// and metrics.jsonl) that is neither the working directory nor a parent of
// it.
void check_new_run_dir(const std::string& dir, bool overwrite);

// Removes what a previous run wrote (config, metrics, tokenizer, ckpt/,
// logs/, trace/) and nothing else; the caller holds the lock.
void clear_run_dir(const std::string& dir);

// An exclusive flock on <dir>/.lock for the life of the object (the
// directory is created if absent). A second process gets a ConfigError
// naming the holder's pid and host.
class RunDirLock {
  public:
    explicit RunDirLock(const std::string& dir);
    ~RunDirLock();
    RunDirLock(const RunDirLock&) = delete;
    RunDirLock& operator=(const RunDirLock&) = delete;

  private:
    int fd_ = -1;
};

// Keeps the lines of <dir>/metrics.jsonl whose "step" is at most `step`
// (a resumed run writes the later ones again), and drops a torn last line.
// Rewritten atomically. Returns the number of lines dropped.
int64_t truncate_metrics(const std::string& dir, int64_t step);

// Appends one JSON object per line. A failed write (a full disk) is reported
// loudly on stderr and the file cut back to its last complete line, so the
// file stays valid JSON lines; the run goes on and later lines are written
// once there is room. lost() counts the records that could not be written.
class MetricsLog {
  public:
    MetricsLog(const std::string& path, bool append);
    ~MetricsLog();
    MetricsLog(const MetricsLog&) = delete;
    MetricsLog& operator=(const MetricsLog&) = delete;
    void write(const nlohmann::json& record);
    int64_t lost() const { return lost_; }
    const std::string& path() const { return path_; }

  private:
    std::string path_;
    int fd_ = -1;
    int64_t good_size_ = 0;  // bytes up to the end of the last complete line
    bool torn_ = false;      // a failed write may have left bytes past good_size_
    int64_t lost_ = 0;
};

}  // namespace apiary::train
