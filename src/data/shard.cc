#include "data/shard.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <map>

#include "core/error.h"
#include "data/file_io.h"

namespace apiary::data {

namespace fs = std::filesystem;

uint64_t write_shard(const std::string& path, const std::vector<uint32_t>& tokens,
                     const std::vector<uint64_t>& doc_starts, uint32_t token_bytes,
                     uint64_t tokenizer_hash, uint64_t vocab_size) {
    APIARY_CHECK(token_bytes == 2 || token_bytes == 4, "token_bytes {}", token_bytes);
    ShardHeader h{};
    std::memcpy(h.magic, kShardMagic, 8);
    h.version = kShardVersion;
    h.token_bytes = token_bytes;
    h.num_tokens = tokens.size();
    h.num_docs = doc_starts.size();
    h.tokenizer_hash = tokenizer_hash;
    h.vocab_size = vocab_size;
    std::string buf(kShardHeaderBytes + tokens.size() * token_bytes + doc_starts.size() * 8, '\0');
    std::memcpy(buf.data(), &h, sizeof(h));
    char* p = buf.data() + kShardHeaderBytes;
    if (token_bytes == 2) {
        for (size_t i = 0; i < tokens.size(); ++i) {
            const auto t = static_cast<uint16_t>(tokens[i]);
            std::memcpy(p + 2 * i, &t, 2);
        }
    } else {
        std::memcpy(p, tokens.data(), tokens.size() * 4);
    }
    std::memcpy(p + tokens.size() * token_bytes, doc_starts.data(), doc_starts.size() * 8);
    write_file_atomic(path, buf);
    return xxhash64(buf.data(), buf.size());
}

ShardReader::ShardReader(const std::string& path) : path_(path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        throw DataError(
            fmt::format("shard '{}' cannot be opened: {} (is the manifest's "
                        "directory complete?)",
                        path, std::strerror(errno)));
    }
    struct stat st {};
    ::fstat(fd, &st);
    size_ = static_cast<size_t>(st.st_size);
    if (size_ < kShardHeaderBytes) {
        ::close(fd);
        throw DataError(
            fmt::format("shard '{}' is truncated: {} bytes, shorter than the "
                        "{}-byte header",
                        path, size_, kShardHeaderBytes));
    }
    void* m = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
    ::close(fd);
    if (m == MAP_FAILED) {
        throw IoError(fmt::format("cannot mmap shard '{}': {}", path, std::strerror(errno)));
    }
    data_ = static_cast<const uint8_t*>(m);
    std::memcpy(&header_, data_, sizeof(header_));
    const auto& h = header_;
    if (std::memcmp(h.magic, kShardMagic, 8) != 0) {
        close();
        throw DataError(
            fmt::format("shard '{}': bad magic at byte 0; not an apiary token shard", path));
    }
    if (h.version != kShardVersion) {
        close();
        throw DataError(
            fmt::format("shard '{}': format version {} at byte 8, this build reads "
                        "version {}",
                        path, h.version, kShardVersion));
    }
    if (h.token_bytes != 2 && h.token_bytes != 4) {
        close();
        throw DataError(fmt::format("shard '{}': token width {} at byte 12 is neither 2 nor 4",
                                    path, h.token_bytes));
    }
    const uint64_t want = kShardHeaderBytes + h.num_tokens * h.token_bytes + h.num_docs * 8;
    if (h.num_tokens > size_ || h.num_docs > size_ || want != size_) {
        const uint64_t n_tok = h.num_tokens, n_doc = h.num_docs;
        close();
        throw DataError(
            fmt::format("shard '{}' is truncated or padded: the header (byte 16) "
                        "promises {} tokens and {} documents, i.e. {} bytes, but the "
                        "file has {} bytes",
                        path, n_tok, n_doc, want, st.st_size));
    }
    const uint64_t index_at = kShardHeaderBytes + h.num_tokens * h.token_bytes;
    uint64_t prev = 0;
    for (uint64_t d = 0; d < h.num_docs; ++d) {
        const uint64_t s = doc_start(d);
        if (s >= h.num_tokens || (d > 0 && s <= prev)) {
            close();
            throw DataError(
                fmt::format("shard '{}': document index entry {} at byte {} is {}, "
                            "out of order or past {} tokens",
                            path, d, index_at + 8 * d, s, h.num_tokens));
        }
        prev = s;
    }
}

ShardReader::~ShardReader() { close(); }

ShardReader::ShardReader(ShardReader&& o) noexcept { *this = std::move(o); }

ShardReader& ShardReader::operator=(ShardReader&& o) noexcept {
    if (this != &o) {
        close();
        path_ = std::move(o.path_);
        data_ = o.data_;
        size_ = o.size_;
        header_ = o.header_;
        o.data_ = nullptr;
        o.size_ = 0;
    }
    return *this;
}

void ShardReader::close() {
    if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
    data_ = nullptr;
}

uint64_t ShardReader::file_hash() const { return xxhash64(data_, size_); }

void ShardReader::verify(const std::string& expected) const {
    const std::string got = hex64(file_hash());
    if (got != expected) {
        throw DataError(
            fmt::format("shard '{}' is corrupt: xxh64 of its {} bytes is {}, the "
                        "manifest says {}; re-run `apiary data prepare`",
                        path_, size_, got, expected));
    }
    for (uint64_t i = 0; i < header_.num_tokens; ++i) {
        if (token(i) >= header_.vocab_size) {
            throw DataError(
                fmt::format("shard '{}': token {} at byte {} is {}, past the "
                            "vocabulary size {}",
                            path_, i, kShardHeaderBytes + i * header_.token_bytes, token(i),
                            header_.vocab_size));
        }
    }
}

void check_against_manifest(const ShardReader& r, const Manifest& m, const ShardInfo& s) {
    auto differs = [&](const char* what, size_t offset, const auto& got, const auto& want) {
        return DataError(
            fmt::format("shard '{}': {} {} (header byte {}) differs from the "
                        "manifest's {}; the shard or '{}/manifest.json' was changed "
                        "after `apiary data prepare` wrote them",
                        r.path(), what, got, offset, want, m.dir));
    };
    if (r.file_bytes() != s.bytes) {
        throw DataError(
            fmt::format("shard '{}' has {} bytes, the manifest says {}; re-run "
                        "`apiary data prepare`",
                        r.path(), r.file_bytes(), s.bytes));
    }
    if (r.num_tokens() != s.tokens) {
        throw differs("token count", offsetof(ShardHeader, num_tokens), r.num_tokens(), s.tokens);
    }
    if (r.num_docs() != s.documents) {
        throw differs("document count", offsetof(ShardHeader, num_docs), r.num_docs(), s.documents);
    }
    if (r.token_bytes() != m.token_bytes) {
        throw differs("token size in bytes", offsetof(ShardHeader, token_bytes), r.token_bytes(),
                      m.token_bytes);
    }
    if (hex64(r.tokenizer_hash()) != m.tokenizer_hash) {
        throw differs("tokenizer hash", offsetof(ShardHeader, tokenizer_hash),
                      hex64(r.tokenizer_hash()), m.tokenizer_hash);
    }
    if (r.vocab_size() != m.vocab_size) {
        throw differs("vocabulary size", offsetof(ShardHeader, vocab_size), r.vocab_size(),
                      m.vocab_size);
    }
}

void check_tokens_in_vocab(const ShardReader& r, uint64_t first, const int32_t* tokens, uint64_t n,
                           uint64_t vocab_size, const char* why_unverified) {
    for (uint64_t i = 0; i < n; ++i) {
        if (tokens[i] >= 0 && uint64_t(tokens[i]) < vocab_size) continue;
        const uint64_t at = first + i;
        throw DataError(fmt::format(
            "shard '{}': token {} at byte {} is {}, past the vocabulary size {} ({}, so the "
            "shard was not checked before use; `apiary data verify {}` checks every shard)",
            r.path(), at, kShardHeaderBytes + at * r.token_bytes(), uint32_t(tokens[i]), vocab_size,
            why_unverified, fs::path(r.path()).parent_path().string()));
    }
}

uint32_t ShardReader::token(uint64_t i) const {
    const uint8_t* p = data_ + kShardHeaderBytes + i * header_.token_bytes;
    if (header_.token_bytes == 2) {
        uint16_t t;
        std::memcpy(&t, p, 2);
        return t;
    }
    uint32_t t;
    std::memcpy(&t, p, 4);
    return t;
}

void ShardReader::copy_tokens(uint64_t begin, uint64_t n, int32_t* out) const {
    APIARY_CHECK(begin + n <= header_.num_tokens, "tokens [{}, {}) past {} in '{}'", begin,
                 begin + n, header_.num_tokens, path_);
    const uint8_t* p = data_ + kShardHeaderBytes + begin * header_.token_bytes;
    if (header_.token_bytes == 2) {
        for (uint64_t i = 0; i < n; ++i) {
            uint16_t t;
            std::memcpy(&t, p + 2 * i, 2);
            out[i] = t;
        }
    } else {
        std::memcpy(out, p, n * 4);
    }
}

uint64_t ShardReader::doc_start(uint64_t d) const {
    uint64_t s;
    std::memcpy(&s, data_ + kShardHeaderBytes + header_.num_tokens * header_.token_bytes + 8 * d,
                8);
    return s;
}

// ---- manifest ---------------------------------------------------------------

nlohmann::ordered_json Manifest::to_json() const {
    nlohmann::ordered_json j;
    j["format"] = "apiary-token-shards";
    j["version"] = 1;
    j["tokenizer"] = {{"hash", tokenizer_hash}, {"vocab_size", vocab_size}};
    j["token_dtype"] = token_bytes == 2 ? "uint16" : "uint32";
    uint64_t train = 0, val = 0;
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (const auto& s : shards) {
        (s.split == "val" ? val : train) += s.tokens;
        list.push_back({{"file", s.file},
                        {"split", s.split},
                        {"tokens", s.tokens},
                        {"documents", s.documents},
                        {"bytes", s.bytes},
                        {"xxh64", s.xxh64}});
    }
    j["tokens"] = {{"train", train}, {"val", val}};
    j["shards"] = list;
    j["sources"] = sources;
    j["settings"] = settings;
    return j;
}

Manifest Manifest::from_json(const nlohmann::json& j, const std::string& source) {
    auto bad = [&](const std::string& what) {
        return DataError(fmt::format("manifest '{}': {}", source, what));
    };
    Manifest m;
    try {
        if (!j.is_object() || j.value("format", "") != "apiary-token-shards") {
            throw bad(
                "'format' is not \"apiary-token-shards\"; not a manifest written by "
                "`apiary data prepare`");
        }
        if (j.at("version").get<int>() != 1) throw bad("unsupported 'version'");
        m.tokenizer_hash = j.at("tokenizer").at("hash").get<std::string>();
        m.vocab_size = j.at("tokenizer").at("vocab_size").get<uint64_t>();
        const std::string dtype = j.at("token_dtype").get<std::string>();
        if (dtype != "uint16" && dtype != "uint32") throw bad("token_dtype '" + dtype + "'");
        m.token_bytes = dtype == "uint16" ? 2 : 4;
        // The vocabulary sizes the trainer's embedding and the unigram
        // baseline: a hostile count must not size them.
        const uint64_t max_vocab = m.token_bytes == 2 ? uint64_t(1) << 16 : kMaxVocabSize;
        if (m.vocab_size == 0 || m.vocab_size > max_vocab) {
            throw bad(fmt::format("tokenizer.vocab_size {} is outside [1, {}] for {} tokens",
                                  m.vocab_size, max_vocab, dtype));
        }
        const auto& list = j.at("shards");
        if (!list.is_array()) throw bad("'shards' is not an array");
        std::map<std::string, size_t> seen;
        for (size_t i = 0; i < list.size(); ++i) {
            const auto& e = list[i];
            ShardInfo s;
            s.file = e.at("file").get<std::string>();
            s.split = e.at("split").get<std::string>();
            s.tokens = e.at("tokens").get<uint64_t>();
            s.documents = e.at("documents").get<uint64_t>();
            s.bytes = e.at("bytes").get<uint64_t>();
            s.xxh64 = e.at("xxh64").get<std::string>();
            if (s.file.empty() || s.file.find("..") != std::string::npos || s.file[0] == '/') {
                throw bad(
                    fmt::format("shards[{}].file '{}' must be a plain name in the "
                                "manifest's directory",
                                i, s.file));
            }
            if (s.split != "train" && s.split != "val") {
                throw bad(
                    fmt::format("shards[{}].split '{}' is neither train nor val", i, s.split));
            }
            // A shard listed twice would be read twice as often as the others.
            if (const auto [it, fresh] = seen.emplace(s.file, i); !fresh) {
                throw bad(
                    fmt::format("shards[{}] and shards[{}] both list '{}'; every shard "
                                "appears once",
                                it->second, i, s.file));
            }
            m.shards.push_back(std::move(s));
        }
        if (j.contains("sources")) m.sources = j["sources"];
        if (j.contains("settings")) m.settings = j["settings"];
    } catch (const nlohmann::json::exception& e) {
        throw bad(fmt::format("missing or mistyped field: {}", e.what()));
    }
    return m;
}

Manifest Manifest::load(const std::string& dir_or_file) {
    std::string file = dir_or_file;
    if (fs::is_directory(file)) file = (fs::path(file) / "manifest.json").string();
    if (!fs::exists(file)) {
        throw DataError(
            fmt::format("manifest '{}' not found; run `apiary data prepare --out DIR` "
                        "first",
                        file));
    }
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(read_file(file, kMaxManifestBytes, "manifest"));
    } catch (const nlohmann::json::parse_error& e) {
        throw DataError(fmt::format("manifest '{}': not valid JSON at byte {}", file, e.byte));
    } catch (const IoError& e) {
        throw DataError(e.what());
    }
    Manifest m = from_json(j, file);
    const auto parent = fs::path(file).parent_path();
    m.dir = parent.empty() ? std::string(".") : parent.string();
    return m;
}

void Manifest::save() const {
    write_file_atomic((fs::path(dir) / "manifest.json").string(), to_json().dump(1) + "\n");
}

std::vector<ShardInfo> Manifest::split(const std::string& name) const {
    std::vector<ShardInfo> out;
    for (const auto& s : shards) {
        if (s.split == name) out.push_back(s);
    }
    return out;
}

}  // namespace apiary::data
