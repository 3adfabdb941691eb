#pragma once
// Remote shards: `http(s)://` and `s3://` sources read through libcurl into a
// local, size-bounded cache.
//
// A source path that is a URL names a directory: URL/manifest.json is fetched
// first, then each shard URL/<file> is downloaded with HTTP range requests of
// `range_bytes`; a connection that drops mid-file resumes from the last byte
// received (up to `retries` attempts in a row without progress). Every
// download is checked against the manifest's size and xxhash64 before it is
// renamed into the cache, so a shard in the cache is always whole and right.
//
// Cache files are named by the URL's hash and the expected checksum (a
// changed remote file is a different entry). The cache is least-recently-used
// by file mtime (a hit touches it); before a download, the oldest files are
// removed until the new one fits in `cache_bytes`. A shard that is mapped by
// a running loader stays readable after eviction (Linux keeps unlinked,
// mapped files), so eviction never breaks a run; it only bounds disk use.
//
// `s3://bucket/key` is fetched the same way from an S3-compatible endpoint,
// path-style and signed with AWS SigV4 (data/s3.h says where the endpoint,
// region and credentials come from). Credentials are looked up at the first
// s3:// request, so http(s) and local sources never need them.

#include <cstdint>
#include <optional>
#include <string>

#include "data/s3.h"
#include "data/shard.h"

namespace apiary::data {

// http://, https:// or s3://: a source the ShardCache fetches.
bool is_url(const std::string& path);

struct RemoteOptions {
    std::string cache_dir = ".cache/apiary-shards";
    uint64_t cache_bytes = 10ull << 30;
    size_t range_bytes = 16u << 20;
    int retries = 5;
    // Waits between failed attempts: exponential backoff with full jitter
    // (retry_delay_s), so that ranks whose downloads failed together do not
    // all come back at the same moment.
    double retry_base_s = 0.2;
    double retry_max_s = 10.0;
    long connect_timeout_s = 10;
    std::string s3_endpoint{};  // empty: AWS_ENDPOINT_URL, else AWS's (data/s3.h)
    std::string s3_region{};    // empty: AWS_REGION, AWS_DEFAULT_REGION, else us-east-1
};

// Seconds to wait before retry number `failures` (1, 2, ...) of a request:
// u * min(max_s, base_s * 2^(failures - 1)), u uniform in [0, 1) ("full
// jitter": the waits of many clients spread over the whole interval).
double retry_delay_s(int failures, double base_s, double max_s, double u);

struct RemoteTarget;  // a URL as requested (remote.cc)

class ShardCache {
  public:
    explicit ShardCache(RemoteOptions options);

    // The body of a small document (e.g. a manifest); IoError naming the URL.
    std::string fetch_text(const std::string& url) const;
    // A local path holding url's content, downloaded unless cached; DataError
    // if the download's size or xxhash64 differs from the expected one.
    std::string get(const std::string& url, uint64_t bytes, const std::string& xxh64);
    // URL/manifest.json, parsed; its dir is the URL, so shard_path() gives URLs.
    Manifest manifest(const std::string& url) const;

    uint64_t downloads() const { return downloads_; }  // files fetched by this object
    uint64_t cached_bytes() const;

  private:
    RemoteTarget target(const std::string& url) const;
    void make_room(uint64_t bytes) const;
    void download(const RemoteTarget& target, const std::string& tmp, uint64_t bytes) const;
    RemoteOptions opt_;
    mutable std::optional<S3Access> s3_;  // resolved at the first s3:// URL
    uint64_t downloads_ = 0;
};

}  // namespace apiary::data
