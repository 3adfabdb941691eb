#include "data/remote.h"

#include <curl/curl.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "core/error.h"
#include "data/file_io.h"

namespace apiary::data {

namespace fs = std::filesystem;

namespace {

void init_curl() {
    static std::once_flag once;
    std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

// GET sends no body: its SigV4 payload hash is the SHA-256 of the empty
// string. Signing it, rather than sending UNSIGNED-PAYLOAD, is accepted by
// every S3 store; libcurl uses this header's value as the payload hash.
constexpr const char* kEmptySha256 =
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
constexpr size_t kMaxErrorBody = 64u << 10;

struct Sink {
    CURL* curl = nullptr;
    std::string* text = nullptr;
    FILE* file = nullptr;
    uint64_t received = 0;
    uint64_t limit = UINT64_MAX;  // refuse bodies longer than asked for
    std::string error_body;       // the body of a status >= 300, never written to text or file
};

size_t on_data(char* ptr, size_t size, size_t n, void* user) {
    auto* s = static_cast<Sink*>(user);
    const size_t len = size * n;
    long status = 0;
    curl_easy_getinfo(s->curl, CURLINFO_RESPONSE_CODE, &status);
    if (status >= 300) {  // an error document (S3's names the error), not content
        s->error_body.append(ptr, std::min(len, kMaxErrorBody - s->error_body.size()));
        return len;
    }
    if (s->received + len > s->limit) return 0;  // makes curl fail with a write error
    if (s->text) s->text->append(ptr, len);
    if (s->file && std::fwrite(ptr, 1, len, s->file) != len) return 0;
    s->received += len;
    return len;
}

}  // namespace

struct RemoteTarget {
    std::string url;       // as written, named in errors
    std::string http_url;  // what curl requests
    const S3Access* s3 = nullptr;

    // How messages name it: the URL, and for s3:// the request it became.
    std::string where() const {
        return s3 ? fmt::format("'{}' (GET {})", url, http_url) : fmt::format("'{}'", url);
    }
};

namespace {

// One GET (optionally of a byte range); returns the curl code and HTTP status.
std::pair<CURLcode, long> http_get(const RemoteTarget& t, const std::string& range, Sink& sink,
                                   long connect_timeout_s, std::string* error) {
    init_curl();
    CURL* c = curl_easy_init();
    sink.curl = c;
    char err[CURL_ERROR_SIZE] = {};
    curl_easy_setopt(c, CURLOPT_URL, t.http_url.c_str());
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &sink);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, err);
    curl_slist* headers = nullptr;
    if (t.s3) {
        // libcurl signs the request (Authorization, x-amz-date) with these.
        const std::string sigv4 = "aws:amz:" + t.s3->region + ":s3";
        curl_easy_setopt(c, CURLOPT_AWS_SIGV4, sigv4.c_str());
        curl_easy_setopt(c, CURLOPT_USERNAME, t.s3->access_key_id.c_str());
        curl_easy_setopt(c, CURLOPT_PASSWORD, t.s3->secret_access_key.c_str());
        headers = curl_slist_append(headers,
                                    fmt::format("x-amz-content-sha256: {}", kEmptySha256).c_str());
        if (!t.s3->session_token.empty()) {
            headers = curl_slist_append(headers,
                                        ("x-amz-security-token: " + t.s3->session_token).c_str());
        }
        curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
        // A redirect would need a new signature; S3's 301 names the right region instead.
        curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
    } else {
        curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
    }
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, connect_timeout_s);
    // A stalled transfer (< 1 KB/s for 30 s) counts as dropped and is retried.
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1024L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, 30L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    if (!range.empty()) curl_easy_setopt(c, CURLOPT_RANGE, range.c_str());
    const CURLcode rc = curl_easy_perform(c);
    long status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(c);
    curl_slist_free_all(headers);
    *error = err[0] ? err : curl_easy_strerror(rc);
    return {rc, status};
}

// A response with an error status; `what` says which part of an http(s) URL
// was asked for (S3's error document says what went wrong instead).
std::string status_message(const RemoteTarget& t, long status, const std::string& body,
                           const std::string& what) {
    if (t.s3) return s3_error_message(t.url, t.http_url, *t.s3, status, body);
    return fmt::format("cannot fetch '{}'{}: HTTP status {}", t.url, what, status);
}

// The question that ends a message about a server that did not answer.
std::string server_question(const RemoteTarget& t) {
    if (!t.s3) return "is the server up?";
    return fmt::format("is the S3 endpoint {} (from {}) right and up?", t.s3->endpoint,
                       t.s3->endpoint_source);
}

}  // namespace

double retry_delay_s(int failures, double base_s, double max_s, double u) {
    const double ceiling = std::min(max_s, base_s * std::ldexp(1.0, std::min(failures, 60) - 1));
    return std::clamp(u, 0.0, 1.0) * std::max(0.0, ceiling);
}

namespace {

// Sleeps before retry number `failures` of a request (see retry_delay_s).
void back_off(int failures, const RemoteOptions& o) {
    thread_local std::mt19937_64 rng(std::random_device{}());
    const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
    std::this_thread::sleep_for(
        std::chrono::duration<double>(retry_delay_s(failures, o.retry_base_s, o.retry_max_s, u)));
}

}  // namespace

bool is_url(const std::string& path) {
    return path.rfind("http://", 0) == 0 || path.rfind("https://", 0) == 0 || is_s3_url(path);
}

RemoteTarget ShardCache::target(const std::string& url) const {
    if (!is_s3_url(url)) return {url, url, nullptr};
    const S3Location loc = parse_s3_url(url);
    if (!s3_) s3_ = resolve_s3_access(opt_.s3_endpoint, opt_.s3_region, getenv_or_empty);
    return {url, s3_http_url(s3_->endpoint, loc), &*s3_};
}

ShardCache::ShardCache(RemoteOptions options) : opt_(std::move(options)) {
    fs::create_directories(opt_.cache_dir);
}

std::string ShardCache::fetch_text(const std::string& url) const {
    const RemoteTarget t = target(url);
    std::string last;
    for (int attempt = 0; attempt < opt_.retries; ++attempt) {
        if (attempt > 0) back_off(attempt, opt_);
        std::string body, error;
        Sink sink;
        sink.text = &body;
        sink.limit = kMaxManifestBytes;  // a manifest (the only text fetched)
        const auto [rc, status] = http_get(t, "", sink, opt_.connect_timeout_s, &error);
        if (rc == CURLE_OK && status == 200) return body;
        if (rc == CURLE_OK) throw IoError(status_message(t, status, sink.error_body, ""));
        last = error;
    }
    throw IoError(fmt::format("cannot fetch {}: {} (after {} attempts); {}", t.where(), last,
                              opt_.retries, server_question(t)));
}

Manifest ShardCache::manifest(const std::string& url) const {
    std::string base = url;
    while (!base.empty() && base.back() == '/') base.pop_back();
    const std::string murl = base + "/manifest.json";
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(fetch_text(murl));
    } catch (const nlohmann::json::parse_error& e) {
        throw DataError(fmt::format("manifest '{}': not valid JSON at byte {}", murl, e.byte));
    }
    Manifest m = Manifest::from_json(j, murl);
    m.dir = base;
    return m;
}

void ShardCache::download(const RemoteTarget& t, const std::string& tmp, uint64_t bytes) const {
    FILE* f = std::fopen(tmp.c_str(), "wb");
    if (!f) throw IoError(fmt::format("cannot create '{}' in the shard cache", tmp));
    uint64_t offset = 0;
    int failures = 0;
    std::string error;
    while (offset < bytes) {
        const uint64_t end = std::min<uint64_t>(bytes, offset + opt_.range_bytes) - 1;
        Sink sink;
        sink.file = f;
        sink.limit = end - offset + 1;
        const auto [rc, status] =
            http_get(t, fmt::format("{}-{}", offset, end), sink, opt_.connect_timeout_s, &error);
        const uint64_t before = offset;
        if (status == 200 && offset > 0) {
            std::fclose(f);
            throw IoError(
                fmt::format("{} ignores HTTP range requests (status 200 for a range "
                            "from byte {}); serve it from a server that supports them",
                            t.where(), offset));
        }
        if (status != 0 && status != 200 && status != 206) {
            std::fclose(f);
            throw IoError(status_message(t, status, sink.error_body,
                                         fmt::format(" (bytes {}-{})", offset, end)));
        }
        offset += sink.received;  // what arrived is kept, even from a dropped connection
        if (rc == CURLE_OK && offset == end + 1) {
            failures = 0;
            continue;
        }
        // A connection that dropped after some bytes is resumed at once; one
        // that brought nothing waits longer each time.
        failures = offset > before ? 0 : failures + 1;
        if (rc == CURLE_OK) error = "the server closed the response early";
        if (failures >= opt_.retries) {
            std::fclose(f);
            throw IoError(
                fmt::format("cannot fetch {}: {} at byte {} of {} ({} attempts "
                            "without progress); {}",
                            t.where(), error, offset, bytes, failures, server_question(t)));
        }
        if (failures > 0) back_off(failures, opt_);
    }
    if (std::fflush(f) != 0 || ::fsync(fileno(f)) != 0) {
        std::fclose(f);
        throw IoError(fmt::format("cannot write '{}' in the shard cache", tmp));
    }
    std::fclose(f);
}

std::string ShardCache::get(const std::string& url, uint64_t bytes, const std::string& xxh64) {
    const std::string name = hex64(xxhash64(url.data(), url.size())) + "_" + xxh64 + ".bin";
    const fs::path path = fs::path(opt_.cache_dir) / name;
    if (fs::exists(path) && fs::file_size(path) == bytes) {
        ::utimensat(AT_FDCWD, path.c_str(), nullptr, 0);  // most recently used now
        return path.string();
    }
    if (bytes > opt_.cache_bytes) {
        // Checked before the cache is emptied for it or a byte downloaded.
        throw DataError(fmt::format(
            "shard '{}': the manifest gives it {} bytes, more than the whole shard cache ({} "
            "bytes, data.cache_mb): raise data.cache_mb, or the manifest is damaged",
            url, bytes, opt_.cache_bytes));
    }
    const RemoteTarget t = target(url);
    make_room(bytes);
    const std::string tmp = path.string() + "." + std::to_string(::getpid()) + ".part";
    try {
        download(t, tmp, bytes);
    } catch (...) {
        std::error_code ec;
        fs::remove(tmp, ec);  // a part file would only waste cache space
        throw;
    }
    ++downloads_;
    const std::string got = hex64(xxhash64_file(tmp));
    if (got != xxh64) {
        fs::remove(tmp);
        throw DataError(
            fmt::format("shard '{}' is corrupt: xxh64 of the {} bytes downloaded is "
                        "{}, the manifest says {}",
                        url, bytes, got, xxh64));
    }
    fs::rename(tmp, path);
    return path.string();
}

uint64_t ShardCache::cached_bytes() const {
    uint64_t total = 0;
    for (const auto& e : fs::directory_iterator(opt_.cache_dir)) {
        if (e.path().extension() == ".bin") total += e.file_size();
    }
    return total;
}

void ShardCache::make_room(uint64_t bytes) const {
    struct Entry {
        fs::path path;
        uint64_t size;
        int64_t mtime_ns;
    };
    std::vector<Entry> entries;
    uint64_t total = 0;
    for (const auto& e : fs::directory_iterator(opt_.cache_dir)) {
        if (e.path().extension() != ".bin") continue;
        struct stat st {};
        if (::stat(e.path().c_str(), &st) != 0) continue;
        entries.push_back({e.path(), uint64_t(st.st_size),
                           int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec});
        total += uint64_t(st.st_size);
    }
    std::sort(entries.begin(), entries.end(),
              [](const Entry& a, const Entry& b) { return a.mtime_ns < b.mtime_ns; });
    for (const auto& e : entries) {
        if (total + bytes <= opt_.cache_bytes) break;
        std::error_code ec;
        if (fs::remove(e.path, ec)) total -= e.size;
    }
}

}  // namespace apiary::data
