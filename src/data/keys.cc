#include "data/keys.h"

#include "core/config.h"
#include "core/error.h"
#include "data/file_io.h"
#include "data/loader.h"
#include "data/tokenizer.h"

namespace apiary::data {

void add_keys(core::Schema& s) {
    s.add_string("data.sources", "",
                 "token shard directories from `apiary data prepare`, mixed by weight: "
                 "\"dirA:0.7,dirB:0.3\" (weight optional, default 1)");
    s.add_string("data.tokenizer_file", "",
                 "tokenizer.json of the shards; when set, every manifest's tokenizer hash must "
                 "match it");
    s.add_int("data.seed", 1234,
              "seed of the training data order (the global shuffle, with the epoch)", 0);
    s.add_bool("data.shuffle", true, "shuffle training windows (validation is never shuffled)");
    s.add_int("data.prefetch", 4, "batches the loader thread prepares ahead (0: no thread)", 0,
              1024);
    s.add_bool("data.verify", true,
               "check each shard's checksum and token range before its first use");
    s.add_string("data.cache_dir", ".cache/apiary-shards",
                 "local cache: http(s):// and s3:// shards (least recently used files go "
                 "first) and, in subdirectories, data.corpus prepared for apiary train");
    s.add_int("data.cache_mb", 10240, "size bound of data.cache_dir in MiB", 1);
    // Credentials are deliberately not keys: they come from AWS_ACCESS_KEY_ID and
    // AWS_SECRET_ACCESS_KEY only, so no config file ever holds them.
    s.add_string("data.s3_endpoint", "",
                 "endpoint of s3://bucket/key sources, path-style (e.g. http://127.0.0.1:7480); "
                 "empty: AWS_ENDPOINT_URL, else https://s3.<region>.amazonaws.com");
    s.add_string("data.s3_region", "",
                 "SigV4 signing region of s3:// sources; empty: AWS_REGION, AWS_DEFAULT_REGION, "
                 "else us-east-1");
    s.add_int("data.curriculum_start", 0,
              "sequence-length curriculum: first seq len (0: off), growing to train.seq_len", 0,
              1 << 22);
    s.add_int("data.curriculum_steps", 0, "steps over which the curriculum reaches train.seq_len",
              0);
    s.add_string("data.curriculum_mode", "tokens",
                 "keep tokens per batch (batch grows as seq len shrinks) or batch size constant",
                 {"tokens", "batch"});
}

RemoteOptions remote_options_from(const core::Config& c) {
    RemoteOptions r;
    r.cache_dir = c.get_string("data.cache_dir");
    r.cache_bytes = static_cast<uint64_t>(c.get_int("data.cache_mb")) << 20;
    r.s3_endpoint = c.get_string("data.s3_endpoint");
    r.s3_region = c.get_string("data.s3_region");
    return r;
}

LoaderOptions LoaderOptions::from_config(const core::Config& c, int dp_rank, int dp_size,
                                         const std::string& split) {
    LoaderOptions o;
    o.sources = parse_sources(c.get_string("data.sources"));
    o.split = split;
    o.batch_size = c.get_int("train.batch_size");
    o.seq_len = c.get_int("train.seq_len");
    o.seed = static_cast<uint64_t>(c.get_int("data.seed"));
    o.dp_rank = dp_rank;
    o.dp_size = dp_size;
    o.shuffle = split == "train" && c.get_bool("data.shuffle");
    o.curriculum_start = split == "train" ? c.get_int("data.curriculum_start") : 0;
    o.curriculum_steps = c.get_int("data.curriculum_steps");
    o.curriculum_mode = c.get_string("data.curriculum_mode") == "batch" ? CurriculumMode::batch
                                                                        : CurriculumMode::tokens;
    o.prefetch = static_cast<int>(c.get_int("data.prefetch"));
    o.verify = c.get_bool("data.verify");
    o.remote = remote_options_from(c);
    if (!c.get_string("data.tokenizer_file").empty()) {
        o.tokenizer_hash = hex64(Tokenizer::load(c.get_string("data.tokenizer_file")).hash());
    }
    return o;
}

}  // namespace apiary::data
