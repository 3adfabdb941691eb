// Remote shards over HTTP: a real nginx on loopback (started here), a server
// of our own that drops every response mid-file, a corrupted remote shard, an
// unreachable URL, and the cache's LRU bound.

#include "data/remote.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <thread>

#include "core/error.h"
#include "data/file_io.h"
#include "data/loader.h"
#include "data/shard.h"
#include "test_util.h"

namespace apiary::data {
namespace {

namespace fs = std::filesystem;
using testing::can_connect;
using testing::free_port;
using testing::TempDir;

// nginx serving `root` on a loopback port, in the foreground as our child.
class Nginx {
  public:
    Nginx(const TempDir& tmp, const std::string& root) : port_(free_port()) {
        EXPECT_TRUE(fs::exists("/usr/sbin/nginx"))
            << "nginx missing: run scripts/install-deps.sh (installs nginx-light)";
        const std::string conf = tmp.path("nginx.conf");
        fs::create_directories(tmp.path("nginx"));
        testing::write_text(conf, fmt::format(R"(daemon off;
master_process off;
worker_processes 1;
pid {0}/nginx.pid;
error_log {0}/error.log;
events {{ worker_connections 64; }}
http {{
    access_log off;
    client_body_temp_path {0}/body;
    proxy_temp_path {0}/proxy;
    fastcgi_temp_path {0}/fastcgi;
    uwsgi_temp_path {0}/uwsgi;
    scgi_temp_path {0}/scgi;
    server {{
        listen 127.0.0.1:{1};
        root {2};
    }}
}}
)",
                                              tmp.path("nginx"), port_, root));
        pid_ = ::fork();
        if (pid_ == 0) {
            ::execl("/usr/sbin/nginx", "nginx", "-c", conf.c_str(), "-p", tmp.path("nginx").c_str(),
                    static_cast<char*>(nullptr));
            ::_exit(127);
        }
        for (int i = 0; i < 200 && !can_connect(port_); ++i) {
            std::this_thread::sleep_for(std::chrono::milliseconds(25));
        }
    }
    ~Nginx() {
        if (pid_ > 0) {
            ::kill(pid_, SIGTERM);
            ::waitpid(pid_, nullptr, 0);
        }
    }
    std::string url(const std::string& path) const {
        return fmt::format("http://127.0.0.1:{}/{}", port_, path);
    }
    bool up() const { return can_connect(port_); }

  private:
    int port_;
    pid_t pid_ = -1;
};

// Serves one file for range requests but closes each response after
// `cut` bytes of body: a server that drops the connection mid-file.
class DroppingServer {
  public:
    DroppingServer(std::string body, size_t cut) : body_(std::move(body)), cut_(cut) {
        fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
        const int one = 1;
        ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a));
        socklen_t len = sizeof(a);
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
        port_ = ntohs(a.sin_port);
        ::listen(fd_, 16);
        thread_ = std::thread([this] { serve(); });
    }
    ~DroppingServer() {
        stop_ = true;
        ::shutdown(fd_, SHUT_RDWR);
        ::close(fd_);
        thread_.join();
    }
    std::string url() const { return fmt::format("http://127.0.0.1:{}/shard.bin", port_); }
    int requests() const { return requests_; }

  private:
    void serve() {
        while (!stop_) {
            const int c = ::accept(fd_, nullptr, nullptr);
            if (c < 0) return;
            std::string req;
            char buf[4096];
            while (req.find("\r\n\r\n") == std::string::npos) {
                const ssize_t n = ::recv(c, buf, sizeof(buf), 0);
                if (n <= 0) break;
                req.append(buf, static_cast<size_t>(n));
            }
            ++requests_;
            size_t from = 0, to = body_.size() - 1;
            const size_t r = req.find("Range: bytes=");
            if (r != std::string::npos)
                std::sscanf(req.c_str() + r, "Range: bytes=%zu-%zu", &from, &to);
            const std::string head = fmt::format(
                "HTTP/1.1 206 Partial Content\r\nContent-Length: {}\r\nContent-Range: bytes "
                "{}-{}/{}\r\nConnection: close\r\n\r\n",
                to - from + 1, from, to, body_.size());
            ::send(c, head.data(), head.size(), MSG_NOSIGNAL);
            ::send(c, body_.data() + from, std::min(cut_, to - from + 1), MSG_NOSIGNAL);
            ::close(c);
        }
    }
    std::string body_;
    size_t cut_;
    int fd_ = -1, port_ = 0;
    std::atomic<bool> stop_{false};
    std::atomic<int> requests_{0};
    std::thread thread_;
};

// A prepared source in `root/name` with `shards` shards of sequential tokens.
void make_source(const std::string& dir, int shards, uint64_t tokens_per_shard) {
    fs::create_directories(dir);
    Manifest m;
    m.dir = dir;
    m.tokenizer_hash = "00000000000000aa";
    m.vocab_size = 1u << 30;
    m.token_bytes = 4;
    uint64_t p = 0;
    for (int k = 0; k < shards; ++k) {
        std::vector<uint32_t> t(tokens_per_shard);
        for (auto& v : t) v = static_cast<uint32_t>(p++);
        const std::string file = fmt::format("train_{:06d}.bin", k);
        const uint64_t h = write_shard(dir + "/" + file, t, {0}, 4, 0xaa, 1u << 30);
        m.shards.push_back({file, "train", t.size(), 1, fs::file_size(dir + "/" + file), hex64(h)});
    }
    m.save();
}

TEST(Remote, LoaderOverNginxSeesTheSameBatchesAsLocal) {
    TempDir tmp("remote_nginx");
    make_source(tmp.path("www/corpus"), 3, 5000);
    Nginx nginx(tmp, tmp.path("www"));
    ASSERT_TRUE(nginx.up()) << testing::read_file_text(tmp.path("nginx/error.log"));
    LoaderOptions o;
    o.batch_size = 4;
    o.seq_len = 64;
    o.sources = {{tmp.path("www/corpus"), 1}};
    Loader local(o);
    o.sources = {{nginx.url("corpus"), 1}};
    o.remote.cache_dir = tmp.path("cache");
    o.remote.range_bytes = 4096;  // many range requests per shard
    Loader remote(o);
    for (int i = 0; i < 20; ++i) ASSERT_EQ(remote.next_batch().tokens, local.next_batch().tokens);
    EXPECT_EQ(ShardCache(o.remote).cached_bytes(), 3 * (kShardHeaderBytes + 4 * 5000 + 8));
}

TEST(Remote, AShardLargerThanTheWholeCacheIsRefusedBeforeDownloading) {
    TempDir tmp("remote_huge");
    // Nothing listens there: the check must come before any request.
    const std::string url = fmt::format("http://127.0.0.1:{}/corpus/train_000000.bin", free_port());
    ShardCache cache({.cache_dir = tmp.path("cache"), .cache_bytes = 1 << 20, .retries = 1});
    try {
        cache.get(url, uint64_t(1) << 50, "0000000000000000");
        FAIL() << "no error";
    } catch (const DataError& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find(url), std::string::npos) << msg;
        EXPECT_NE(msg.find("1125899906842624 bytes, more than the whole shard cache (1048576"),
                  std::string::npos)
            << msg;
    }
}

TEST(Remote, CorruptRemoteShardAndUnreachableServerAreClearErrors) {
    TempDir tmp("remote_errors");
    make_source(tmp.path("www/corpus"), 1, 1000);
    std::string shard = read_file(tmp.path("www/corpus/train_000000.bin"));
    shard[kShardHeaderBytes + 5] ^= 1;
    write_file_atomic(tmp.path("www/corpus/train_000000.bin"), shard);
    Nginx nginx(tmp, tmp.path("www"));
    ShardCache cache({.cache_dir = tmp.path("cache")});
    const Manifest m = cache.manifest(nginx.url("corpus"));
    try {
        cache.get(m.shard_path(m.shards[0]), m.shards[0].bytes, m.shards[0].xxh64);
        FAIL() << "no error";
    } catch (const DataError& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find(nginx.url("corpus/train_000000.bin")), std::string::npos) << msg;
        EXPECT_NE(msg.find("xxh64"), std::string::npos) << msg;
    }
    EXPECT_EQ(cache.cached_bytes(), 0u);  // nothing half-checked stays in the cache

    const std::string dead = fmt::format("http://127.0.0.1:{}/corpus", free_port());
    ShardCache quick({.cache_dir = tmp.path("cache"), .retries = 2, .connect_timeout_s = 2});
    try {
        quick.manifest(dead);
        FAIL() << "no error";
    } catch (const IoError& e) {
        EXPECT_NE(std::string(e.what()).find(dead + "/manifest.json"), std::string::npos)
            << e.what();
    }
}

TEST(Remote, DroppedConnectionsResumeFromTheLastByte) {
    TempDir tmp("remote_drop");
    std::string body(100000, '\0');
    for (size_t i = 0; i < body.size(); ++i) body[i] = static_cast<char>(i * 131 % 251);
    DroppingServer server(body, 7000);  // every response stops after 7000 bytes
    ShardCache cache({.cache_dir = tmp.path("cache"), .range_bytes = 1 << 20});
    const std::string path =
        cache.get(server.url(), body.size(), hex64(xxhash64(body.data(), body.size())));
    EXPECT_EQ(read_file(path), body);
    EXPECT_EQ(server.requests(), 15);  // ceil(100000 / 7000)
}

TEST(Remote, CacheEvictsLeastRecentlyUsedToStayWithinItsBound) {
    TempDir tmp("remote_lru");
    make_source(tmp.path("www/c"), 3, 2000);  // 3 shards of 8072 bytes
    Nginx nginx(tmp, tmp.path("www"));
    ShardCache cache({.cache_dir = tmp.path("cache"), .cache_bytes = 20000});
    const Manifest m = cache.manifest(nginx.url("c"));
    auto get = [&](int k) {
        return cache.get(m.shard_path(m.shards[k]), m.shards[k].bytes, m.shards[k].xxh64);
    };
    const std::string p0 = get(0);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    get(1);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    get(0);  // a hit: 0 is now more recent than 1
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    get(2);  // evicts 1
    EXPECT_EQ(cache.downloads(), 3u);
    EXPECT_LE(cache.cached_bytes(), 20000u);
    EXPECT_TRUE(fs::exists(p0));
    get(0);
    EXPECT_EQ(cache.downloads(), 3u);
    get(1);
    EXPECT_EQ(cache.downloads(), 4u);
}

}  // namespace
}  // namespace apiary::data
