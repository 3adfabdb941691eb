#include "data/s3.h"

#include <cstdlib>

#include "core/error.h"

namespace apiary::data {

namespace {

constexpr const char* kScheme = "s3://";

bool unreserved(unsigned char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '.' || c == '_' || c == '~';
}

// The text of the first <tag>...</tag>, entities decoded. S3 error documents
// are flat and small (<Error><Code/><Message/>...</Error>), so two leaf
// elements are found by search rather than with an XML parser.
std::string element(const std::string& xml, const std::string& tag) {
    const std::string open = "<" + tag + ">", close = "</" + tag + ">";
    const size_t begin = xml.find(open);
    if (begin == std::string::npos) return "";
    const size_t from = begin + open.size();
    const size_t end = xml.find(close, from);
    if (end == std::string::npos) return "";
    std::string raw = xml.substr(from, end - from), out;
    static const std::pair<const char*, char> kEntities[] = {
        {"&lt;", '<'}, {"&gt;", '>'}, {"&quot;", '"'}, {"&apos;", '\''}, {"&amp;", '&'}};
    for (size_t i = 0; i < raw.size();) {
        bool decoded = false;
        for (const auto& [name, ch] : kEntities) {
            if (raw.compare(i, std::char_traits<char>::length(name), name) == 0) {
                out += ch;
                i += std::char_traits<char>::length(name);
                decoded = true;
                break;
            }
        }
        if (!decoded) out += raw[i++];
    }
    return out;
}

// What to check for the error codes a reader of shards meets; "" otherwise.
std::string hint(const std::string& code, const S3Location& loc, const S3Access& a) {
    if (code == "SignatureDoesNotMatch") {
        return "the request signature was rejected: check AWS_SECRET_ACCESS_KEY (and that the "
               "region '" +
               a.region + "' is the one the store expects)";
    }
    if (code == "InvalidAccessKeyId") {
        return "the store does not know the access key in AWS_ACCESS_KEY_ID";
    }
    if (code == "AccessDenied") {
        return "these credentials may not read bucket '" + loc.bucket + "'";
    }
    if (code == "NoSuchKey") {
        const bool manifest = loc.key == "manifest.json" ||
                              (loc.key.size() > 14 && loc.key.ends_with("/manifest.json"));
        return "bucket '" + loc.bucket + "' has no object '" + loc.key + "'; " +
               (manifest ? "check the source path in data.sources"
                         : "the manifest lists it: upload every file of the prepared directory");
    }
    if (code == "NoSuchBucket") {
        return "there is no bucket '" + loc.bucket + "' at " + a.endpoint + " (from " +
               a.endpoint_source + ")";
    }
    if (code == "RequestTimeTooSkewed") {
        return "this machine's clock differs too much from the store's";
    }
    if (code == "PermanentRedirect" || code == "AuthorizationHeaderMalformed") {
        return "the bucket lives in another region or endpoint; set data.s3_region / "
               "data.s3_endpoint";
    }
    return "";
}

}  // namespace

bool is_s3_url(const std::string& url) { return url.rfind(kScheme, 0) == 0; }

S3Location parse_s3_url(const std::string& url) {
    if (!is_s3_url(url)) {
        throw ConfigError(fmt::format("'{}' is not an s3:// URL (s3://bucket/key)", url));
    }
    const std::string rest = url.substr(std::char_traits<char>::length(kScheme));
    const size_t slash = rest.find('/');
    S3Location loc;
    loc.bucket = rest.substr(0, slash);
    if (slash != std::string::npos) loc.key = rest.substr(slash + 1);
    if (loc.bucket.empty()) {
        throw ConfigError(fmt::format("'{}' names no bucket; write s3://bucket/key", url));
    }
    for (const unsigned char c : loc.bucket) {
        if (!unreserved(c) || c == '~') {
            throw ConfigError(fmt::format(
                "'{}': bucket name '{}' may only hold letters, digits, '.', '-' and '_'", url,
                loc.bucket));
        }
    }
    return loc;
}

std::string s3_http_url(const std::string& endpoint, const S3Location& location) {
    if (const size_t colon = endpoint.find("://"); colon != std::string::npos &&
                                                   endpoint.rfind("http://", 0) != 0 &&
                                                   endpoint.rfind("https://", 0) != 0) {
        throw ConfigError(fmt::format(
            "S3 endpoint '{}': the scheme '{}' is not supported; an S3 endpoint is an "
            "http:// or https:// URL (data sources are http(s):// or s3:// URLs, or local "
            "directories)",
            endpoint, endpoint.substr(0, colon)));
    }
    if (endpoint.rfind("http://", 0) != 0 && endpoint.rfind("https://", 0) != 0) {
        throw ConfigError(
            fmt::format("S3 endpoint '{}' needs a scheme: write http://{} or https://{}", endpoint,
                        endpoint, endpoint));
    }
    std::string url = endpoint;
    const size_t host = url.find("://") + 3;
    while (url.size() > host && url.back() == '/') url.pop_back();
    if (url.size() == host) {
        throw ConfigError(fmt::format("S3 endpoint '{}' names no host", endpoint));
    }
    url += "/" + location.bucket + "/";
    for (const unsigned char c : location.key) {
        if (unreserved(c) || c == '/') {
            url += static_cast<char>(c);
        } else {
            url += fmt::format("%{:02X}", c);
        }
    }
    return url;
}

std::string getenv_or_empty(const std::string& name) {
    const char* v = std::getenv(name.c_str());
    return v ? v : "";
}

S3Access resolve_s3_access(const std::string& config_endpoint, const std::string& config_region,
                           const EnvLookup& env) {
    S3Access a;
    a.access_key_id = env("AWS_ACCESS_KEY_ID");
    a.secret_access_key = env("AWS_SECRET_ACCESS_KEY");
    a.session_token = env("AWS_SESSION_TOKEN");
    std::string missing;
    if (a.access_key_id.empty()) missing = "AWS_ACCESS_KEY_ID";
    if (a.secret_access_key.empty()) {
        missing += std::string(missing.empty() ? "" : " and ") + "AWS_SECRET_ACCESS_KEY";
    }
    if (!missing.empty()) {
        throw ConfigError(
            "s3:// sources need credentials: set " + missing +
            " in the environment (apiary reads S3 credentials from the environment only, "
            "never from config files)");
    }
    a.region = config_region;
    if (a.region.empty()) a.region = env("AWS_REGION");
    if (a.region.empty()) a.region = env("AWS_DEFAULT_REGION");
    if (a.region.empty()) a.region = "us-east-1";
    if (!config_endpoint.empty()) {
        a.endpoint = config_endpoint;
        a.endpoint_source = "data.s3_endpoint";
    } else if (!env("AWS_ENDPOINT_URL").empty()) {
        a.endpoint = env("AWS_ENDPOINT_URL");
        a.endpoint_source = "AWS_ENDPOINT_URL";
    } else {
        a.endpoint = "https://s3." + a.region + ".amazonaws.com";
        a.endpoint_source = "the default for region " + a.region;
    }
    s3_http_url(a.endpoint, {"bucket", ""});  // throws for an endpoint without a scheme
    return a;
}

S3ErrorBody parse_s3_error(const std::string& xml) {
    return {element(xml, "Code"), element(xml, "Message")};
}

std::string s3_error_message(const std::string& s3_url, const std::string& http_url,
                             const S3Access& access, long status, const std::string& body) {
    const S3ErrorBody e = parse_s3_error(body);
    std::string msg =
        fmt::format("cannot fetch '{}' (GET {}): HTTP status {}", s3_url, http_url, status);
    if (!e.code.empty()) msg += " " + e.code;
    if (!e.message.empty()) msg += " (" + e.message + ")";
    const std::string h = hint(e.code, parse_s3_url(s3_url), access);
    if (!h.empty()) msg += "; " + h;
    return msg;
}

}  // namespace apiary::data
