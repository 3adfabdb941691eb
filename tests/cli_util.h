#pragma once
// Runs the built `apiary` binary as a user would and captures its exit code
// and output (stdout and stderr together).

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

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
