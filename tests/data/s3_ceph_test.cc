// s3:// sources against a real S3 store: Ceph's radosgw from Debian, started
// by each test on loopback (ceph_cluster.h). A dataset made by `data prepare`
// is uploaded with curl's own SigV4 signing; the loader must read it into
// exactly the batches of the local directory, and bad credentials or a
// missing key must be refused with errors that name the URL and S3's code.

#include <gtest/gtest.h>

#include <filesystem>
#include <memory>

#include "ceph_cluster.h"
#include "core/config.h"
#include "core/error.h"
#include "data/bpe_train.h"
#include "data/keys.h"
#include "data/loader.h"
#include "data/prepare.h"
#include "data/remote.h"
#include "data/s3.h"
#include "test_util.h"
#include "train/keys.h"
#include "train/train_data.h"

namespace apiary::data {
namespace {

namespace fs = std::filesystem;
using testing::CephCluster;
using testing::ScopedEnv;
using testing::TempDir;

constexpr const char* kAccessKey = "APIARYTESTACCESSKEY0";
constexpr const char* kSecretKey = "apiary-test-secret-key-for-radosgw-0123";
constexpr const char* kBucket = "apiary-data";

// A prepared source: ~40 KB of documents in small shards (train and val).
void make_dataset(const TempDir& tmp, const std::string& out) {
    const char* words[] = {"alpha", "beta", "gamma", "delta", "\xce\xbb", "42", "it's", "!"};
    std::string jsonl;
    BpeTrainer trainer({.vocab_size = 300});
    for (size_t d = 0; d < 300; ++d) {
        std::string doc = "doc " + std::to_string(d) + ":";
        for (size_t w = 0; w < 20 + d % 37; ++w) doc += std::string(" ") + words[(d * 7 + w) % 8];
        trainer.add_text(doc);
        jsonl += nlohmann::json({{"text", doc}}).dump() + "\n";
    }
    testing::write_text(tmp.path("docs.jsonl"), jsonl);
    trainer.train().save(tmp.path("tokenizer.json"));
    PrepareOptions o;
    o.inputs = {tmp.path("docs.jsonl")};
    o.tokenizer = tmp.path("tokenizer.json");
    o.out = out;
    o.val_fraction = 0.2;
    o.unit_bytes = 1024;
    o.shard_units = 4;
    o.num_threads = 1;
    prepare(o);
}

class S3Ceph : public ::testing::Test {
  protected:
    void SetUp() override {
        if (!CephCluster::available()) {
            GTEST_SKIP() << "Ceph (ceph-mon, ceph-osd, radosgw) is not installed: run "
                            "scripts/install-deps.sh";
        }
        tmp_ = std::make_unique<TempDir>(
            std::string("s3_ceph_") +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
        try {
            ceph_ = std::make_unique<CephCluster>(tmp_->path("ceph"));
            ceph_->create_user("apiary", kAccessKey, kSecretKey);
        } catch (const std::exception& e) {
            FAIL() << "cannot start the test's Ceph cluster: " << e.what();
        }
        ASSERT_NO_FATAL_FAILURE(s3_cli("-X PUT", ""));
        make_dataset(*tmp_, tmp_->path("corpus"));
    }

    // A request signed by curl's command line (not by our code), with the
    // right credentials; `key` empty: the bucket itself.
    void s3_cli(const std::string& args, const std::string& key) const {
        testing::run_or_fail(fmt::format(
            "curl -sS --fail-with-body --aws-sigv4 aws:amz:us-east-1:s3 --user '{}:{}' "
            "-H 'x-amz-content-sha256: UNSIGNED-PAYLOAD' {} '{}'",
            kAccessKey, kSecretKey, args, s3_http_url(ceph_->endpoint(), {kBucket, key})));
    }
    // Every file of `dir` to s3://kBucket/prefix/<file>.
    void upload(const std::string& dir, const std::string& prefix) const {
        for (const auto& e : fs::directory_iterator(dir)) {
            ASSERT_NO_FATAL_FAILURE(s3_cli("-T '" + e.path().string() + "'",
                                           prefix + "/" + e.path().filename().string()));
        }
    }
    RemoteOptions remote() const {
        return {.cache_dir = tmp_->path("cache"),
                .retries = 2,
                .connect_timeout_s = 5,
                .s3_endpoint = ceph_->endpoint(),
                .s3_region = "us-east-1"};
    }
    std::string s3_url(const std::string& key) const {
        return fmt::format("s3://{}/{}", kBucket, key);
    }

    std::unique_ptr<TempDir> tmp_;  // declared first: removed after the cluster stops
    std::unique_ptr<CephCluster> ceph_;
};

// The IoError message of f ("" when none).
template <class F>
std::string io_error(F f) {
    try {
        f();
    } catch (const IoError& e) {
        return e.what();
    }
    return "";
}

TEST_F(S3Ceph, LoaderReadsTheSameBatchesAsFromTheLocalDirectory) {
    // Bytes a key must percent-encode, so that radosgw checks our canonical URI.
    const std::string prefix = "corpus v1+\xce\xbb";
    ASSERT_NO_FATAL_FAILURE(upload(tmp_->path("corpus"), prefix));
    ScopedEnv env({{"AWS_ACCESS_KEY_ID", kAccessKey},
                   {"AWS_SECRET_ACCESS_KEY", kSecretKey},
                   {"AWS_ENDPOINT_URL", nullptr},
                   {"AWS_REGION", nullptr}});
    // Through the config keys, as `apiary train` will read them; no secret in there.
    core::Schema schema;
    core::add_shared_keys(schema);
    add_keys(schema);
    core::Config config(schema);
    config.load_string(fmt::format(R"([data]
sources = "{}"
s3_endpoint = "{}"
s3_region = "us-east-1"
cache_dir = "{}"
[train]
batch_size = 4
seq_len = 32
)",
                                   s3_url(prefix), ceph_->endpoint(), tmp_->path("cache")),
                       "s3_test.toml");
    for (const std::string split : {"train", "val"}) {
        LoaderOptions o = LoaderOptions::from_config(config, 0, 1, split);
        ASSERT_EQ(o.remote.s3_endpoint, ceph_->endpoint());
        o.remote.range_bytes = 4096;  // several signed range requests per shard
        Loader remote(o);
        o.sources = {{tmp_->path("corpus"), 1}};
        Loader local(o);
        for (int i = 0; i < 25; ++i) {
            ASSERT_EQ(remote.next_batch().tokens, local.next_batch().tokens)
                << split << " batch " << i;
        }
    }
    uint64_t shard_bytes = 0;
    for (const auto& s : Manifest::load(tmp_->path("corpus")).shards) shard_bytes += s.bytes;
    EXPECT_EQ(ShardCache(remote()).cached_bytes(), shard_bytes);  // every shard, once
}

TEST_F(S3Ceph, BadCredentialsAreRefusedWithTheS3ErrorCode) {
    ASSERT_NO_FATAL_FAILURE(upload(tmp_->path("corpus"), "corpus"));
    ScopedEnv env({{"AWS_ACCESS_KEY_ID", kAccessKey}, {"AWS_SECRET_ACCESS_KEY", kSecretKey}});
    ShardCache good(remote());
    const Manifest m = good.manifest(s3_url("corpus"));  // takes the right credentials now

    const char* wrong = "not-the-secret-key-of-this-user-000000";
    ScopedEnv wrong_secret({{"AWS_SECRET_ACCESS_KEY", wrong}});
    const std::string url = s3_url("corpus/manifest.json");
    std::string msg = io_error([&] { ShardCache(remote()).manifest(s3_url("corpus")); });
    EXPECT_NE(msg.find(fmt::format("'{}' (GET {}/{}/corpus/manifest.json): HTTP status 403 "
                                   "SignatureDoesNotMatch",
                                   url, ceph_->endpoint(), kBucket)),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("check AWS_SECRET_ACCESS_KEY"), std::string::npos) << msg;
    EXPECT_EQ(msg.find(wrong), std::string::npos) << msg;

    // The same for a shard's range requests.
    const ShardInfo& s = m.shards[0];
    msg = io_error([&] { ShardCache(remote()).get(m.shard_path(s), s.bytes, s.xxh64); });
    EXPECT_NE(msg.find("'" + m.shard_path(s) + "'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("HTTP status 403 SignatureDoesNotMatch"), std::string::npos) << msg;

    ScopedEnv unknown({{"AWS_ACCESS_KEY_ID", "APIARYUNKNOWNKEY0000"}});
    msg = io_error([&] { ShardCache(remote()).manifest(s3_url("corpus")); });
    EXPECT_NE(msg.find("HTTP status 403 InvalidAccessKeyId"), std::string::npos) << msg;

    // A valid user of the store, but the bucket is private to its owner.
    ceph_->create_user("other", "APIARYOTHERACCESSKEY", "other-user-secret-key-000000000000000");
    ScopedEnv other({{"AWS_ACCESS_KEY_ID", "APIARYOTHERACCESSKEY"},
                     {"AWS_SECRET_ACCESS_KEY", "other-user-secret-key-000000000000000"}});
    msg = io_error([&] { ShardCache(remote()).manifest(s3_url("corpus")); });
    EXPECT_NE(msg.find("'" + url + "'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("HTTP status 403 AccessDenied"), std::string::npos) << msg;
    EXPECT_NE(msg.find("may not read bucket 'apiary-data'"), std::string::npos) << msg;
}

TEST_F(S3Ceph, MissingKeyIsNoSuchKeyAndMissingBucketNoSuchBucket) {
    // Only the manifest: every shard it names is missing.
    ASSERT_NO_FATAL_FAILURE(
        s3_cli("-T '" + tmp_->path("corpus/manifest.json") + "'", "partial/manifest.json"));
    // The endpoint from the environment this time.
    ScopedEnv env({{"AWS_ACCESS_KEY_ID", kAccessKey},
                   {"AWS_SECRET_ACCESS_KEY", kSecretKey},
                   {"AWS_ENDPOINT_URL", ceph_->endpoint().c_str()}});
    RemoteOptions r = remote();
    r.s3_endpoint = "";
    std::string msg = io_error([&] { ShardCache(r).manifest(s3_url("absent")); });
    EXPECT_NE(msg.find("'" + s3_url("absent/manifest.json") + "'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("HTTP status 404 NoSuchKey"), std::string::npos) << msg;
    EXPECT_NE(msg.find("has no object 'absent/manifest.json'"), std::string::npos) << msg;

    LoaderOptions o;
    o.sources = {{s3_url("partial"), 1}};
    o.seq_len = 32;
    o.remote = r;
    msg = io_error([&] { Loader loader(o); });
    EXPECT_NE(msg.find("'" + s3_url("partial/train_000000.bin") + "'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("NoSuchKey"), std::string::npos) << msg;
    EXPECT_TRUE(fs::is_empty(r.cache_dir));  // not even a part file

    msg = io_error([&] { ShardCache(r).manifest("s3://no-such-bucket/corpus"); });
    EXPECT_NE(msg.find("HTTP status 404 NoSuchBucket"), std::string::npos) << msg;
    EXPECT_NE(
        msg.find("no bucket 'no-such-bucket' at " + ceph_->endpoint() + " (from AWS_ENDPOINT_URL)"),
        std::string::npos)
        << msg;
}

// `apiary train` resolves its sources (manifests, tokenizer, sample counts)
// before the loader starts; that path must sign for the configured endpoint
// and region too, with no AWS_* variable but the credentials set (it used
// to take only the cache keys, and sent its requests to AWS).
core::Config train_config(const std::string& toml) {
    static core::Schema schema = [] {
        core::Schema s;
        core::add_shared_keys(s);
        train::add_keys(s);
        return s;
    }();
    core::Config config(schema);
    config.load_string(toml, "train_s3.toml");
    return config;
}

TEST_F(S3Ceph, TrainResolvesS3SourcesAtTheConfiguredEndpointAndRegion) {
    ASSERT_NO_FATAL_FAILURE(upload(tmp_->path("corpus"), "train-corpus"));
    ScopedEnv env({{"AWS_ACCESS_KEY_ID", kAccessKey},
                   {"AWS_SECRET_ACCESS_KEY", kSecretKey},
                   {"AWS_ENDPOINT_URL", nullptr},
                   {"AWS_REGION", nullptr},
                   {"AWS_DEFAULT_REGION", nullptr}});
    auto toml = [&](const std::string& region) {
        return fmt::format(R"([data]
sources = "{}"
tokenizer_file = "{}"
s3_endpoint = "{}"
s3_region = "{}"
cache_dir = "{}"
[train]
seq_len = 32
)",
                           s3_url("train-corpus"), tmp_->path("tokenizer.json"), ceph_->endpoint(),
                           region, tmp_->path("cache"));
    };
    const train::TrainData d =
        train::resolve_train_data(train_config(toml("us-east-1")), /*verbose=*/false);
    const Manifest local = Manifest::load(tmp_->path("corpus"));
    EXPECT_EQ(d.manifest, s3_url("train-corpus") + "/manifest.json");
    EXPECT_EQ(d.tokenizer_hash, local.tokenizer_hash);
    EXPECT_EQ(d.vocab_size, int64_t(local.vocab_size));
    EXPECT_GT(d.bytes_per_token, 1.0);
    // radosgw accepts any signing region, but its refusal of a wrong secret
    // names the region the request was signed for: data.s3_region's.
    ScopedEnv wrong({{"AWS_SECRET_ACCESS_KEY", "not-the-secret-key-of-this-user-000000"}});
    const std::string msg =
        io_error([&] { train::resolve_train_data(train_config(toml("eu-test-7")), false); });
    EXPECT_NE(msg.find(fmt::format("(GET {}/{}/train-corpus/manifest.json): HTTP status 403 "
                                   "SignatureDoesNotMatch",
                                   ceph_->endpoint(), kBucket)),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("region 'eu-test-7'"), std::string::npos) << msg;
}

}  // namespace
}  // namespace apiary::data
