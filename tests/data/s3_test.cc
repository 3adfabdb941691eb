// s3:// without a server: URL parsing, path-style endpoint joining, where the
// endpoint, region and credentials come from, S3 error documents, and the
// errors for missing credentials and an endpoint nobody listens on. The
// signed requests themselves are tested against Ceph's radosgw in
// s3_ceph_test.cc (label slow).

#include "data/s3.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <map>

#include "core/config.h"
#include "core/error.h"
#include "data/keys.h"
#include "data/loader.h"
#include "data/remote.h"
#include "test_util.h"

namespace apiary::data {
namespace {

using testing::free_port;
using testing::ScopedEnv;
using testing::TempDir;

// The message of the ConfigError that f throws ("" when none).
template <class F>
std::string config_error(F f) {
    try {
        f();
    } catch (const ConfigError& e) {
        return e.what();
    }
    return "";
}

EnvLookup env_of(std::map<std::string, std::string> vars) {
    return [vars](const std::string& name) {
        const auto it = vars.find(name);
        return it == vars.end() ? std::string() : it->second;
    };
}

TEST(S3Url, SplitsBucketAndKey) {
    EXPECT_TRUE(is_s3_url("s3://b/k"));
    EXPECT_FALSE(is_s3_url("https://b/k"));
    EXPECT_TRUE(is_url("s3://b/k"));
    S3Location l = parse_s3_url("s3://my-bucket.1/corpus/train_000000.bin");
    EXPECT_EQ(l.bucket, "my-bucket.1");
    EXPECT_EQ(l.key, "corpus/train_000000.bin");
    l = parse_s3_url("s3://bucket");
    EXPECT_EQ(l.bucket, "bucket");
    EXPECT_EQ(l.key, "");
    EXPECT_EQ(parse_s3_url("s3://bucket/").key, "");

    std::string msg = config_error([] { parse_s3_url("s3:///corpus"); });
    EXPECT_NE(msg.find("'s3:///corpus' names no bucket"), std::string::npos) << msg;
    msg = config_error([] { parse_s3_url("s3://a:b@host/corpus"); });
    EXPECT_NE(msg.find("bucket name 'a:b@host'"), std::string::npos) << msg;
}

TEST(S3Url, JoinsTheEndpointPathStyleAndEncodesTheKey) {
    EXPECT_EQ(s3_http_url("http://127.0.0.1:7480", {"b", "dir/train_000001.bin"}),
              "http://127.0.0.1:7480/b/dir/train_000001.bin");
    EXPECT_EQ(s3_http_url("https://store.example/prefix//", {"b", "k"}),
              "https://store.example/prefix/b/k");
    // SigV4's canonical URI: every byte but A-Za-z0-9-._~ and '/' percent-encoded.
    EXPECT_EQ(s3_http_url("http://h", {"b", "a b+c=~_-.\xce\xbb/%"}),
              "http://h/b/a%20b%2Bc%3D~_-.%CE%BB/%25");
    EXPECT_EQ(s3_http_url("http://h", {"b", ""}), "http://h/b/");

    std::string msg = config_error([] { s3_http_url("127.0.0.1:7480", {"b", "k"}); });
    EXPECT_NE(msg.find("write http://127.0.0.1:7480 or https://127.0.0.1:7480"), std::string::npos)
        << msg;
    msg = config_error([] { s3_http_url("http://", {"b", "k"}); });
    EXPECT_NE(msg.find("names no host"), std::string::npos) << msg;
    // Another scheme is named as unsupported, not given a second one.
    msg = config_error([] { s3_http_url("ftp://store.example", {"b", "k"}); });
    EXPECT_EQ(msg.find("http://ftp://"), std::string::npos) << msg;
    EXPECT_NE(msg.find("the scheme 'ftp' is not supported"), std::string::npos) << msg;
    EXPECT_NE(msg.find("http:// or https://"), std::string::npos) << msg;
}

TEST(S3Access, EndpointAndRegionFromConfigThenEnvironmentThenAws) {
    const std::map<std::string, std::string> creds = {{"AWS_ACCESS_KEY_ID", "AKID"},
                                                      {"AWS_SECRET_ACCESS_KEY", "SECRET"}};
    auto with = [&](std::map<std::string, std::string> more) {
        more.insert(creds.begin(), creds.end());
        return env_of(more);
    };
    S3Access a = resolve_s3_access("", "", with({}));
    EXPECT_EQ(a.access_key_id, "AKID");
    EXPECT_EQ(a.secret_access_key, "SECRET");
    EXPECT_EQ(a.session_token, "");
    EXPECT_EQ(a.region, "us-east-1");
    EXPECT_EQ(a.endpoint, "https://s3.us-east-1.amazonaws.com");

    a = resolve_s3_access("", "", with({{"AWS_DEFAULT_REGION", "eu-west-3"}}));
    EXPECT_EQ(a.region, "eu-west-3");
    EXPECT_EQ(a.endpoint, "https://s3.eu-west-3.amazonaws.com");
    a = resolve_s3_access("", "",
                          with({{"AWS_DEFAULT_REGION", "eu-west-3"},
                                {"AWS_REGION", "ap-south-1"},
                                {"AWS_ENDPOINT_URL", "http://10.0.0.1:9000"},
                                {"AWS_SESSION_TOKEN", "TOKEN"}}));
    EXPECT_EQ(a.region, "ap-south-1");
    EXPECT_EQ(a.endpoint, "http://10.0.0.1:9000");
    EXPECT_EQ(a.endpoint_source, "AWS_ENDPOINT_URL");
    EXPECT_EQ(a.session_token, "TOKEN");
    // Config keys win over the environment.
    a = resolve_s3_access(
        "http://127.0.0.1:7480", "default",
        with({{"AWS_REGION", "ap-south-1"}, {"AWS_ENDPOINT_URL", "http://10.0.0.1:9000"}}));
    EXPECT_EQ(a.region, "default");
    EXPECT_EQ(a.endpoint, "http://127.0.0.1:7480");
    EXPECT_EQ(a.endpoint_source, "data.s3_endpoint");

    const std::string msg = config_error([&] { resolve_s3_access("host:1", "", with({})); });
    EXPECT_NE(msg.find("needs a scheme"), std::string::npos) << msg;
}

TEST(Remote, RetriesBackOffExponentiallyWithFullJitter) {
    // The ceiling doubles from the base up to the maximum...
    EXPECT_DOUBLE_EQ(retry_delay_s(1, 0.2, 10, 1.0), 0.2);
    EXPECT_DOUBLE_EQ(retry_delay_s(2, 0.2, 10, 1.0), 0.4);
    EXPECT_DOUBLE_EQ(retry_delay_s(4, 0.2, 10, 1.0), 1.6);
    EXPECT_DOUBLE_EQ(retry_delay_s(7, 0.2, 10, 1.0), 10.0);
    EXPECT_DOUBLE_EQ(retry_delay_s(1000, 0.2, 10, 1.0), 10.0);
    // ...and the wait is spread over all of [0, ceiling).
    EXPECT_DOUBLE_EQ(retry_delay_s(3, 0.2, 10, 0.0), 0.0);
    EXPECT_DOUBLE_EQ(retry_delay_s(3, 0.2, 10, 0.25), 0.2);
    EXPECT_DOUBLE_EQ(retry_delay_s(3, 0.2, 10, 0.5), 0.4);
}

// Every data.* key of a remote source reaches the options, for the loader
// and for `apiary train`'s resolution of its sources (one function for both).
TEST(S3Access, EveryRemoteKeyOfTheConfigIsPassedThrough) {
    core::Schema schema;
    core::add_shared_keys(schema);
    add_keys(schema);
    core::Config config(schema);
    config.load_string(R"([data]
cache_dir = "/tmp/shard-cache"
cache_mb = 77
s3_endpoint = "http://127.0.0.1:7480"
s3_region = "eu-test-7"
)",
                       "remote.toml");
    const RemoteOptions r = remote_options_from(config);
    EXPECT_EQ(r.cache_dir, "/tmp/shard-cache");
    EXPECT_EQ(r.cache_bytes, uint64_t(77) << 20);
    EXPECT_EQ(r.s3_endpoint, "http://127.0.0.1:7480");
    EXPECT_EQ(r.s3_region, "eu-test-7");
    const RemoteOptions l = LoaderOptions::from_config(config, 0, 1, "train").remote;
    EXPECT_EQ(l.s3_endpoint, r.s3_endpoint);
    EXPECT_EQ(l.s3_region, r.s3_region);
    EXPECT_EQ(l.cache_bytes, r.cache_bytes);
}

TEST(S3Access, MissingCredentialsNameTheVariable) {
    std::string msg = config_error([] { resolve_s3_access("", "", env_of({})); });
    EXPECT_NE(msg.find("set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"), std::string::npos)
        << msg;
    msg = config_error([] { resolve_s3_access("", "", env_of({{"AWS_ACCESS_KEY_ID", "AKID"}})); });
    EXPECT_NE(msg.find("set AWS_SECRET_ACCESS_KEY in the environment"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("AKID"), std::string::npos) << msg;
    msg = config_error([] {
        resolve_s3_access("", "", env_of({{"AWS_SECRET_ACCESS_KEY", "SECRET"}}));
    });
    EXPECT_NE(msg.find("set AWS_ACCESS_KEY_ID in the environment"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("SECRET"), std::string::npos) << msg;
}

TEST(S3Error, CodeAndMessageOfTheErrorDocument) {
    // As radosgw and AWS send them.
    const std::string rgw =
        R"(<?xml version="1.0" encoding="UTF-8"?><Error><Code>NoSuchKey</Code><Message></Message>)"
        R"(<BucketName>bkt</BucketName><RequestId>tx0-1</RequestId><HostId>1-d-d</HostId></Error>)";
    S3ErrorBody e = parse_s3_error(rgw);
    EXPECT_EQ(e.code, "NoSuchKey");
    EXPECT_EQ(e.message, "");
    const std::string aws = R"(<?xml version="1.0" encoding="UTF-8"?>
<Error>
  <Code>SignatureDoesNotMatch</Code>
  <Message>The request signature we calculated does not match &amp; &lt;so&gt; on</Message>
  <StringToSign>AWS4-HMAC-SHA256 ...</StringToSign>
</Error>)";
    e = parse_s3_error(aws);
    EXPECT_EQ(e.code, "SignatureDoesNotMatch");
    EXPECT_EQ(e.message, "The request signature we calculated does not match & <so> on");
    e = parse_s3_error("<html><body>502 Bad Gateway</body></html>");
    EXPECT_EQ(e.code, "");
    EXPECT_EQ(parse_s3_error("<Error><Code>Trunc").code, "");
}

TEST(S3Error, MessagesNameTheUrlTheCodeAndWhatToCheck) {
    S3Access a;
    a.endpoint = "http://127.0.0.1:7480";
    a.endpoint_source = "data.s3_endpoint";
    a.region = "us-east-1";
    a.access_key_id = "AKID";
    a.secret_access_key = "SECRET";
    const std::string url = "s3://bkt/corpus/manifest.json";
    const std::string http = "http://127.0.0.1:7480/bkt/corpus/manifest.json";
    std::string msg =
        s3_error_message(url, http, a, 403, "<Error><Code>SignatureDoesNotMatch</Code></Error>");
    EXPECT_NE(msg.find("'" + url + "' (GET " + http + "): HTTP status 403 SignatureDoesNotMatch"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("check AWS_SECRET_ACCESS_KEY"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("SECRET;"), std::string::npos) << msg;
    msg = s3_error_message(url, http, a, 403, "<Error><Code>AccessDenied</Code></Error>");
    EXPECT_NE(msg.find("may not read bucket 'bkt'"), std::string::npos) << msg;
    msg = s3_error_message(url, http, a, 404, "<Error><Code>NoSuchKey</Code></Error>");
    EXPECT_NE(msg.find("bucket 'bkt' has no object 'corpus/manifest.json'"), std::string::npos)
        << msg;
    msg = s3_error_message(url, http, a, 404, "<Error><Code>NoSuchBucket</Code></Error>");
    EXPECT_NE(msg.find("no bucket 'bkt' at http://127.0.0.1:7480 (from data.s3_endpoint)"),
              std::string::npos)
        << msg;
    msg = s3_error_message(url, http, a, 502, "<html>Bad Gateway</html>");
    EXPECT_NE(msg.find("HTTP status 502"), std::string::npos) << msg;
}

TEST(S3Url, SourceListsKeepS3UrlsWhole) {
    const auto s = parse_sources("s3://bkt/a:0.25, s3://bkt/b,s3://bkt");
    ASSERT_EQ(s.size(), 3u);
    EXPECT_EQ(s[0].path, "s3://bkt/a");
    EXPECT_EQ(s[0].weight, 0.25);
    EXPECT_EQ(s[1].path, "s3://bkt/b");
    EXPECT_EQ(s[1].weight, 1.0);
    EXPECT_EQ(s[2].path, "s3://bkt");
}

int closed_port() { return free_port(); }  // nothing listens there once found

TEST(S3Cache, MissingCredentialsAreAConfigErrorAtTheFirstS3Url) {
    TempDir tmp("s3_nocreds");
    ScopedEnv env({{"AWS_ACCESS_KEY_ID", "AKID"}, {"AWS_SECRET_ACCESS_KEY", nullptr}});
    LoaderOptions o;
    o.sources = {{"s3://bkt/corpus", 1}};
    o.remote.cache_dir = tmp.path("cache");
    const std::string msg = config_error([&] { Loader loader(o); });
    EXPECT_NE(msg.find("set AWS_SECRET_ACCESS_KEY"), std::string::npos) << msg;
}

TEST(S3Cache, UnreachableEndpointNamesUrlAndEndpoint) {
    TempDir tmp("s3_dead");
    ScopedEnv env({{"AWS_ACCESS_KEY_ID", "AKID"},
                   {"AWS_SECRET_ACCESS_KEY", "SECRET"},
                   {"AWS_ENDPOINT_URL", nullptr}});
    const std::string endpoint = fmt::format("http://127.0.0.1:{}", closed_port());
    ShardCache cache({.cache_dir = tmp.path("cache"),
                      .retries = 2,
                      .connect_timeout_s = 2,
                      .s3_endpoint = endpoint});
    try {
        cache.manifest("s3://bkt/corpus");
        FAIL() << "no error";
    } catch (const IoError& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("'s3://bkt/corpus/manifest.json' (GET " + endpoint +
                           "/bkt/corpus/manifest.json)"),
                  std::string::npos)
            << msg;
        EXPECT_NE(msg.find("is the S3 endpoint " + endpoint + " (from data.s3_endpoint) right"),
                  std::string::npos)
            << msg;
        EXPECT_EQ(msg.find("SECRET"), std::string::npos) << msg;
    }
}

}  // namespace
}  // namespace apiary::data
