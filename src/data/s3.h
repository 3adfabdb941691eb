#pragma once
// `s3://bucket/key` URLs: where their requests go, with which credentials,
// and what an S3 error response means. The transfer itself (libcurl, signed
// with AWS SigV4 by CURLOPT_AWS_SIGV4) is in remote.cc; this part does no I/O
// so that it can be tested without a server.
//
// Requests are path-style, `<endpoint>/<bucket>/<key>`, which every
// S3-compatible store (Ceph radosgw, MinIO, ...) and AWS itself accept, so the
// bucket name never has to be a valid host name. Credentials come only from
// the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, optionally
// AWS_SESSION_TOKEN), never from config files, so that a config shared with a
// run or committed next to it cannot leak them.

#include <functional>
#include <string>

namespace apiary::data {

bool is_s3_url(const std::string& url);

struct S3Location {
    std::string bucket;
    std::string key;  // may be empty: the bucket's root, e.g. a source directory
};

// "s3://bucket/a/b" -> {"bucket", "a/b"}; ConfigError naming the URL when
// the bucket is missing or not a valid bucket name.
S3Location parse_s3_url(const std::string& url);

// `endpoint` (scheme, host, optional port and path prefix) joined with the
// bucket and the key, each key byte outside [A-Za-z0-9-._~/] percent-encoded
// as SigV4's canonical URI requires. ConfigError for an endpoint without
// http:// or https://.
std::string s3_http_url(const std::string& endpoint, const S3Location& location);

// Where s3:// requests go and how they are signed.
struct S3Access {
    std::string endpoint;         // e.g. "http://127.0.0.1:7480"
    std::string endpoint_source;  // the key or variable it came from, for messages
    std::string region;
    std::string access_key_id, secret_access_key, session_token;
};

// Empty strings take the environment: endpoint `config_endpoint`, else
// AWS_ENDPOINT_URL, else AWS's https://s3.<region>.amazonaws.com; region
// `config_region`, else AWS_REGION, else AWS_DEFAULT_REGION, else us-east-1.
// ConfigError naming each missing credential variable. `env` is getenv in
// use; tests pass a map.
using EnvLookup = std::function<std::string(const std::string& name)>;
S3Access resolve_s3_access(const std::string& config_endpoint, const std::string& config_region,
                           const EnvLookup& env);
std::string getenv_or_empty(const std::string& name);

// The <Code> and <Message> of an S3 error document; empty when absent.
struct S3ErrorBody {
    std::string code, message;
};
S3ErrorBody parse_s3_error(const std::string& xml);

// One line for a failed request: the s3:// URL, the HTTP URL it went to, the
// status and S3 error code, and what to check for the common codes
// (SignatureDoesNotMatch, InvalidAccessKeyId, AccessDenied, NoSuchKey,
// NoSuchBucket, ...).
std::string s3_error_message(const std::string& s3_url, const std::string& http_url,
                             const S3Access& access, long status, const std::string& body);

}  // namespace apiary::data
