#pragma once
// Token shards and their manifest (format: docs/formats.md).
//
// A shard file is a 64-byte header, the tokens (little-endian uint16 or
// uint32), then the document index (uint64 token offsets where documents
// start). Shards are written whole to a temporary name, fsynced and renamed,
// so a shard that exists under its final name is complete. manifest.json
// lists every shard with its token count and xxhash64 checksum, the
// tokenizer's hash and the sources.

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace apiary::data {

inline constexpr char kShardMagic[8] = {'A', 'P', 'I', 'A', 'R', 'Y', 'T', 'K'};
inline constexpr uint32_t kShardVersion = 1;
inline constexpr size_t kShardHeaderBytes = 64;
// The largest vocabulary a manifest may declare for uint32 tokens: batches
// hold tokens as int32.
inline constexpr uint64_t kMaxVocabSize = uint64_t(1) << 31;

struct ShardHeader {
    char magic[8];
    uint32_t version;
    uint32_t token_bytes;  // 2 (uint16) or 4 (uint32)
    uint64_t num_tokens;
    uint64_t num_docs;
    uint64_t tokenizer_hash;
    uint64_t vocab_size;
    uint8_t reserved[16];
};
static_assert(sizeof(ShardHeader) == kShardHeaderBytes);

// Writes one shard atomically; returns the file's xxhash64.
uint64_t write_shard(const std::string& path, const std::vector<uint32_t>& tokens,
                     const std::vector<uint64_t>& doc_starts, uint32_t token_bytes,
                     uint64_t tokenizer_hash, uint64_t vocab_size);

// A read-only, memory-mapped shard. open() checks the header and sizes and
// the document index; verify() also checks the checksum and that every token
// is inside the vocabulary. Errors are DataError naming the file and the byte
// offset of the first bad byte.
class ShardReader {
  public:
    ShardReader() = default;
    explicit ShardReader(const std::string& path);
    ~ShardReader();
    ShardReader(ShardReader&& o) noexcept;
    ShardReader& operator=(ShardReader&& o) noexcept;
    ShardReader(const ShardReader&) = delete;
    ShardReader& operator=(const ShardReader&) = delete;

    // Checks the whole file against an expected xxhash64 (hex) and the vocabulary.
    void verify(const std::string& expected_xxh64_hex) const;
    uint64_t file_hash() const;

    const std::string& path() const { return path_; }
    uint64_t num_tokens() const { return header_.num_tokens; }
    uint64_t num_docs() const { return header_.num_docs; }
    uint32_t token_bytes() const { return header_.token_bytes; }
    uint64_t tokenizer_hash() const { return header_.tokenizer_hash; }
    uint64_t vocab_size() const { return header_.vocab_size; }
    uint64_t file_bytes() const { return size_; }
    uint32_t token(uint64_t i) const;
    // Copies tokens [begin, begin + n) into out as int32.
    void copy_tokens(uint64_t begin, uint64_t n, int32_t* out) const;
    uint64_t doc_start(uint64_t d) const;

  private:
    void close();
    std::string path_;
    const uint8_t* data_ = nullptr;
    size_t size_ = 0;
    ShardHeader header_{};
};

struct ShardInfo {
    std::string file;   // relative to the manifest's directory
    std::string split;  // "train" or "val"
    uint64_t tokens = 0, documents = 0, bytes = 0;
    std::string xxh64;  // hex
};

struct Manifest {
    std::string dir;             // directory of manifest.json
    std::string tokenizer_hash;  // hex
    uint64_t vocab_size = 0;
    uint32_t token_bytes = 2;
    std::vector<ShardInfo> shards;
    nlohmann::json sources = nlohmann::json::array();
    nlohmann::json settings = nlohmann::json::object();

    nlohmann::ordered_json to_json() const;
    static Manifest from_json(const nlohmann::json& j, const std::string& source);
    // Reads DIR/manifest.json (or a path to the file); DataError on any problem.
    static Manifest load(const std::string& dir_or_file);
    void save() const;  // DIR/manifest.json, atomically
    std::vector<ShardInfo> split(const std::string& name) const;
    std::string shard_path(const ShardInfo& s) const { return dir + "/" + s.file; }
};

// Checks what a shard's header and size say against its manifest entry and
// the manifest: file size, token count, documents, token dtype, tokenizer
// hash and vocabulary size. DataError naming the file, the field (with its
// byte offset in the header) and both values. verify() then checks content.
void check_against_manifest(const ShardReader& r, const Manifest& m, const ShardInfo& s);

// Checks n tokens just read from shard r (starting at token `first`) against
// the vocabulary: the loader's guard for shards whose content was not
// verified (data.verify = false). DataError naming the file and the token.
void check_tokens_in_vocab(const ShardReader& r, uint64_t first, const int32_t* tokens, uint64_t n,
                           uint64_t vocab_size, const char* why_unverified);

}  // namespace apiary::data
