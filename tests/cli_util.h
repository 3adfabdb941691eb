#pragma once
// Runs the built `apiary` binary as a user would and captures its exit code
// and output (stdout and stderr together), or runs it in the background.

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace apiary::testing {

struct CommandResult {
    int exit_code = -1;
    std::string output;
};

inline CommandResult run_command(const std::string& cmd) {
    CommandResult r;
    FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
    if (!p) return r;
    std::array<char, 4096> buf;
    size_t n;
    while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
    const int status = ::pclose(p);
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return r;
}

inline std::string apiary_bin() { return std::string(APIARY_BINARY_DIR) + "/apiary"; }

}  // namespace apiary::testing

namespace apiary::testing {

// A command running in the background (through /bin/sh), its output going
// to a file, for tests that signal it or act while it runs.
class Background {
  public:
    Background(const std::string& cmd, const std::string& output_file) : output_(output_file) {
        pid_ = ::fork();
        if (pid_ == 0) {
            const std::string line = "exec " + cmd + " > '" + output_file + "' 2>&1";
            ::execl("/bin/sh", "sh", "-c", line.c_str(), static_cast<char*>(nullptr));
            ::_exit(127);
        }
    }
    ~Background() {
        if (pid_ > 0 && !done_) {
            ::kill(pid_, SIGKILL);
            wait();
        }
    }
    pid_t pid() const { return pid_; }
    void signal(int sig) const { ::kill(pid_, sig); }
    // The exit code (128 + signal if a signal ended it).
    int wait() {
        if (done_) return code_;
        int status = 0;
        ::waitpid(pid_, &status, 0);
        done_ = true;
        code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        return code_;
    }
    // True once the command has ended (its exit code then in wait()),
    // polling for at most `seconds`.
    bool exited_within(double seconds) {
        const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
        while (!done_) {
            int status = 0;
            if (::waitpid(pid_, &status, WNOHANG) == pid_) {
                done_ = true;
                code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
                break;
            }
            if (std::chrono::steady_clock::now() >= end) return false;
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
        return true;
    }
    std::string output() const {
        std::ifstream in(output_);
        std::stringstream ss;
        ss << in.rdbuf();
        return ss.str();
    }

  private:
    std::string output_;
    pid_t pid_ = -1;
    bool done_ = false;
    int code_ = -1;
};

// True once the process `pid` has the stop signals (SIGINT, SIGTERM,
// SIGUSR1) blocked in its main thread: apiary's own code runs and takes them
// (before, only the dynamic loader runs and a signal has its default effect).
inline bool blocks_stop_signals(pid_t pid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/status");
    std::string line;
    while (std::getline(in, line)) {
        if (line.rfind("SigBlk:", 0) != 0) continue;
        const unsigned long long mask = std::stoull(line.substr(7), nullptr, 16);
        const auto bit = [](int sig) { return 1ULL << (sig - 1); };
        const unsigned long long want = bit(SIGINT) | bit(SIGTERM) | bit(SIGUSR1);
        return (mask & want) == want;
    }
    return false;
}

// Polls `cond` every 20 ms for up to `seconds`; true once it holds.
inline bool wait_until(const std::function<bool()>& cond, double seconds) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (std::chrono::steady_clock::now() < end) {
        if (cond()) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return cond();
}

// Lines of a text file.
inline std::vector<std::string> read_lines(const std::string& path) {
    std::vector<std::string> lines;
    std::ifstream in(path);
    for (std::string l; std::getline(in, l);) lines.push_back(l);
    return lines;
}

}  // namespace apiary::testing
