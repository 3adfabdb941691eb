#include "ckpt/sharded.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <stdexcept>

#include "core/error.h"

namespace apiary::ckpt {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string hex(uint64_t v) { return fmt::format("{:016x}", v); }

json placement_json(const core::Placement& p) {
    json j = {{"global_shape", p.global_shape}, {"local_shape", p.local_shape}};
    if (p.dim >= 0) {
        j["dim"] = p.dim;
        json pieces = json::array();
        for (const auto& [start, len] : p.pieces) pieces.push_back({start, len});
        j["pieces"] = pieces;
    }
    return j;
}

// A file name the manifest may name: a plain name inside the directory.
void check_file_name(const std::string& name, const std::string& where) {
    if (name.empty() || name.find('/') != std::string::npos || name == "." || name == ".." ||
        name.find('\0') != std::string::npos) {
        throw IoError(
            fmt::format("{}: file name '{}' would leave the checkpoint directory", where, name));
    }
}

int64_t json_int(const json& j, const char* key, const std::string& where) {
    if (!j.contains(key) || !j[key].is_number_integer() || j[key].get<int64_t>() < 0) {
        throw IoError(fmt::format("{}: '{}' is missing or not a count", where, key));
    }
    return j[key].get<int64_t>();
}

core::Placement placement_from(const json& j, const std::string& where) {
    core::Placement p;
    try {
        p.global_shape = j.at("global_shape").get<std::vector<int64_t>>();
        p.local_shape = j.at("local_shape").get<std::vector<int64_t>>();
        if (j.contains("dim")) {
            p.dim = j.at("dim").get<int>();
            for (const auto& piece : j.at("pieces")) {
                p.pieces.emplace_back(piece.at(0).get<int64_t>(), piece.at(1).get<int64_t>());
            }
        }
        p.validate();
    } catch (const json::exception& e) {
        throw IoError(fmt::format("{}: malformed placement: {}", where, e.what()));
    } catch (const std::invalid_argument& e) {
        throw IoError(fmt::format("{}: placement: {}", where, e.what()));
    }
    return p;
}

}  // namespace

json write_chunks(const std::string& dir, const std::string& file,
                  const std::vector<Chunk>& chunks) {
    std::vector<TensorEntry> entries;
    json listed = json::array();
    for (const auto& c : chunks) {
        const std::string key = fmt::format("{}/{}/{}", c.kind, c.tensor, c.begin);
        const size_t nbytes = size_t(c.count) * sizeof(float);
        entries.push_back({key, "F32", {c.count}, c.data, nbytes});
        listed.push_back({{"tensor", c.tensor},
                          {"kind", c.kind},
                          {"file", file},
                          {"key", key},
                          {"placement", placement_json(c.place)},
                          {"begin", c.begin},
                          {"count", c.count}});
    }
    const FileDigest d =
        write_safetensors((fs::path(dir) / file).string(), entries, {{"producer", "apiary"}});
    for (size_t i = 0; i < listed.size(); ++i) listed[i]["xxh64"] = hex(d.tensors[i]);
    return {{"file", file}, {"bytes", d.bytes}, {"xxh64", hex(d.xxh64)}, {"chunks", listed}};
}

namespace {

std::string piece_name(const void* data, size_t n) {
    const XXH128_hash_t h = XXH3_128bits(data, n);
    return fmt::format("{:016x}{:016x}", h.high64, h.low64);
}

fs::path piece_path(const fs::path& blob_dir, const std::string& hash) {
    return blob_dir / hash.substr(0, 2) / hash;
}

// The blob directory of a checkpoint directory: <run>/ckpt/blobs.
fs::path blob_dir_of(const std::string& ckpt_dir) {
    return fs::path(ckpt_dir).parent_path() / "blobs";
}

}  // namespace

json write_chunks_incremental(const std::string& blob_dir, const std::vector<Chunk>& chunks,
                              int64_t piece_bytes) {
    APIARY_CHECK(piece_bytes >= 4 && piece_bytes % 4 == 0, "piece size {} bytes", piece_bytes);
    json listed = json::array();
    uint64_t written = 0, reused = 0;
    for (const auto& c : chunks) {
        const size_t nbytes = size_t(c.count) * sizeof(float);
        const char* data = reinterpret_cast<const char*>(c.data);
        json pieces = json::array();
        for (size_t at = 0; at < nbytes; at += size_t(piece_bytes)) {
            const size_t n = std::min(nbytes - at, size_t(piece_bytes));
            const std::string hash = piece_name(data + at, n);
            const fs::path path = piece_path(blob_dir, hash);
            if (fs::exists(path) && fs::file_size(path) == n) {
                reused += n;
            } else {
                fs::create_directories(path.parent_path());
                atomic_write(path.string(), data + at, n);
                written += n;
            }
            pieces.push_back(hash);
        }
        listed.push_back({{"tensor", c.tensor},
                          {"kind", c.kind},
                          {"pieces", pieces},
                          {"piece_bytes", piece_bytes},
                          {"placement", placement_json(c.place)},
                          {"begin", c.begin},
                          {"count", c.count},
                          {"xxh64", hex(XXH64(c.data, nbytes, 0))}});
    }
    return {{"chunks", listed}, {"bytes_written", written}, {"bytes_reused", reused}};
}

int64_t remove_unreferenced_pieces(const std::string& blob_dir,
                                   const std::vector<std::string>& kept_dirs) {
    if (!fs::is_directory(blob_dir)) return 0;
    std::set<std::string> referenced;
    for (const auto& dir : kept_dirs) {
        std::ifstream in(fs::path(dir) / kManifestFile);
        if (!in) continue;
        const json m = json::parse(in, nullptr, false);
        if (!m.is_object() || !m.contains("chunks")) continue;
        for (const auto& c : m["chunks"]) {
            if (!c.contains("pieces")) continue;
            for (const auto& h : c["pieces"]) referenced.insert(h.get<std::string>());
        }
    }
    int64_t removed = 0;
    for (const auto& sub : fs::directory_iterator(blob_dir)) {
        if (!sub.is_directory()) continue;
        for (const auto& f : fs::directory_iterator(sub.path())) {
            if (referenced.count(f.path().filename().string())) continue;
            fs::remove(f.path());
            ++removed;
        }
    }
    return removed;
}

void write_manifest(const std::string& dir, const std::vector<json>& parts, json meta) {
    json files = json::object(), chunks = json::array();
    for (const auto& part : parts) {
        if (part.contains("file")) {
            files[part["file"].get<std::string>()] = {{"bytes", part["bytes"]},
                                                      {"xxh64", part["xxh64"]}};
        }
        for (const auto& c : part["chunks"]) chunks.push_back(c);
    }
    meta["files"] = files;
    meta["chunks"] = chunks;
    const std::string text = meta.dump(1) + "\n";
    atomic_write((fs::path(dir) / kManifestFile).string(), text.data(), text.size());
}

CheckpointReader::CheckpointReader(const std::string& dir) : dir_(dir) {
    const fs::path path = fs::path(dir) / kManifestFile;
    if (!fs::exists(path) && fs::exists(fs::path(dir) / "meta.json")) {
        open_v1();
        return;
    }
    const std::string where = path.string();
    std::ifstream in(path);
    if (!in) throw IoError(fmt::format("{}: missing (checkpoint incomplete)", where));
    json m;
    try {
        m = json::parse(in);
    } catch (const json::parse_error& e) {
        throw IoError(fmt::format("{}: not valid JSON (byte {})", where, e.byte));
    }
    if (!m.is_object() || !m.contains("files") || !m["files"].is_object() ||
        !m.contains("chunks") || !m["chunks"].is_array()) {
        throw IoError(fmt::format("{}: no 'files' and 'chunks' (not a sharded checkpoint)", where));
    }
    files_ = m["files"];
    for (const auto& [name, rec] : files_.items()) check_file_name(name, where);
    for (size_t i = 0; i < m["chunks"].size(); ++i) {
        const json& c = m["chunks"][i];
        const std::string w = fmt::format("{} (chunk {})", where, i);
        StoredChunk s;
        try {
            s.tensor = c.at("tensor").get<std::string>();
            s.kind = c.at("kind").get<std::string>();
            s.xxh64 = c.at("xxh64").get<std::string>();
            if (c.contains("pieces")) {
                s.pieces = c.at("pieces").get<std::vector<std::string>>();
                s.piece_bytes = c.at("piece_bytes").get<int64_t>();
            } else {
                s.file = c.at("file").get<std::string>();
                s.key = c.at("key").get<std::string>();
            }
        } catch (const json::exception& e) {
            throw IoError(fmt::format("{}: malformed: {}", w, e.what()));
        }
        if (c.contains("pieces")) {
            // Content hashes only: a piece's name can never leave the blob directory.
            for (const auto& h : s.pieces) {
                if (h.size() != 32 ||
                    h.find_first_not_of("0123456789abcdef") != std::string::npos) {
                    throw IoError(fmt::format("{}: piece name '{}' is not a content hash", w, h));
                }
            }
            if (s.piece_bytes < 4 || s.piece_bytes % 4 != 0) {
                throw IoError(fmt::format("{}: piece_bytes {} is not a whole number of floats", w,
                                          s.piece_bytes));
            }
        } else {
            check_file_name(s.file, w);
            if (!files_.contains(s.file)) {
                throw IoError(
                    fmt::format("{}: names file '{}', which 'files' does not list", w, s.file));
            }
        }
        s.place = placement_from(c.at("placement"), w + " '" + s.tensor + "'");
        s.begin = json_int(c, "begin", w);
        s.count = json_int(c, "count", w);
        if (s.begin + s.count > s.place.local_numel()) {
            throw IoError(fmt::format("{}: '{}' elements [{}, {}) beyond its {} local elements", w,
                                      s.tensor, s.begin, s.begin + s.count, s.place.local_numel()));
        }
        by_tensor_[{s.kind, s.tensor}].push_back(chunks_.size());
        chunks_.push_back(std::move(s));
    }
    m.erase("files");
    m.erase("chunks");
    meta_ = std::move(m);
}

CheckpointReader::~CheckpointReader() = default;

void CheckpointReader::open_v1() {
    // Version 1: meta.json, model.safetensors (whole tensors by name) and
    // optimizer.safetensors (m.<name>, v.<name>), checked by the files'
    // digests in meta.json.
    const fs::path path = fs::path(dir_) / "meta.json";
    std::ifstream in(path);
    try {
        meta_ = json::parse(in);
    } catch (const json::parse_error& e) {
        throw IoError(fmt::format("{}: not valid JSON (byte {})", path.string(), e.byte));
    }
    if (meta_.contains("files")) files_ = meta_["files"];
    for (const char* name : {"model.safetensors", "optimizer.safetensors"}) {
        if (!fs::exists(fs::path(dir_) / name)) continue;
        const SafetensorsFile& f = file(name);
        for (const std::string& key : f.names()) {
            StoredChunk s;
            s.file = name;
            s.key = key;
            s.kind = "param";
            s.tensor = key;
            if (std::string(name) == "optimizer.safetensors") {
                s.kind = key.rfind("m.", 0) == 0 ? "adam_m" : "adam_v";
                s.tensor = key.substr(2);
            }
            const TensorEntry& e = f.entry(key);
            s.place.global_shape = e.shape;
            s.place.local_shape = e.shape;
            s.count = s.place.local_numel();
            by_tensor_[{s.kind, s.tensor}].push_back(chunks_.size());
            chunks_.push_back(std::move(s));
        }
    }
    meta_.erase("files");
}

const SafetensorsFile& CheckpointReader::file(const std::string& name) const {
    auto& f = open_[name];
    if (!f) f = std::make_unique<SafetensorsFile>((fs::path(dir_) / name).string(), true);
    return *f;
}

std::vector<std::string> CheckpointReader::tensors(const std::string& kind) const {
    std::vector<std::string> out;
    for (const auto& [k, v] : by_tensor_) {
        if (k.first == kind) out.push_back(k.second);
    }
    return out;
}

bool CheckpointReader::has(const std::string& kind, const std::string& tensor) const {
    return by_tensor_.count({kind, tensor}) > 0;
}

std::vector<int64_t> CheckpointReader::global_shape(const std::string& kind,
                                                    const std::string& tensor) const {
    const auto it = by_tensor_.find({kind, tensor});
    if (it == by_tensor_.end()) {
        throw IoError(fmt::format("{}: no {} tensor '{}'", dir_, kind, tensor));
    }
    return chunks_[it->second.front()].place.global_shape;
}

void CheckpointReader::read(const std::string& kind, const std::string& tensor,
                            const core::Placement& want, int64_t begin, int64_t count,
                            float* dst) const {
    const auto it = by_tensor_.find({kind, tensor});
    if (it == by_tensor_.end()) {
        throw IoError(fmt::format("{}: no {} tensor '{}': the checkpoint is of another model", dir_,
                                  kind, tensor));
    }
    // The same layout saved what is asked for (a resume): read it in place.
    for (size_t ci : it->second) {
        const StoredChunk& c = chunks_[ci];
        if (c.begin == begin && c.count == count && c.place.dim == want.dim &&
            c.place.local_shape == want.local_shape && c.place.pieces == want.pieces &&
            c.place.global_shape == want.global_shape) {
            read_chunk_into(c, dst);
            return;
        }
    }
    // The stored runs of the tensor in global order: (global start, length,
    // chunk, element offset within the chunk).
    struct Run {
        int64_t global, len;
        size_t chunk;
        int64_t at;
    };
    std::vector<Run> runs;
    for (size_t ci : it->second) {
        const StoredChunk& c = chunks_[ci];
        if (c.place.global_shape != want.global_shape) {
            throw IoError(
                fmt::format("{}: {} tensor '{}' has global shape [{}], the model needs "
                            "[{}]: the checkpoint is of another model",
                            dir_, kind, tensor, fmt::join(c.place.global_shape, ", "),
                            fmt::join(want.global_shape, ", ")));
        }
        c.place.for_each_run(
            [&](int64_t g, int64_t l, int64_t len) {
                runs.push_back({g, len, ci, l - c.begin});
            },
            c.begin, c.count);
    }
    std::sort(runs.begin(), runs.end(),
              [](const Run& a, const Run& b) { return a.global < b.global; });
    // Chunks are read whole once, on first use, and checked.
    std::map<size_t, std::vector<float>> loaded;
    auto data_of = [&](size_t ci) -> const float* {
        auto found = loaded.find(ci);
        if (found != loaded.end()) return found->second.data();
        return loaded.emplace(ci, chunk_data(chunks_[ci])).first->second.data();
    };
    want.for_each_run(
        [&](int64_t g, int64_t l, int64_t len) {
            // The first stored run that ends after g.
            auto r = std::upper_bound(runs.begin(), runs.end(), g,
                                      [](int64_t x, const Run& run) { return x < run.global; });
            if (r != runs.begin()) --r;
            int64_t done = 0;
            while (done < len) {
                const int64_t at = g + done;
                while (r != runs.end() && r->global + r->len <= at) ++r;
                if (r == runs.end() || r->global > at) {
                    throw IoError(fmt::format(
                        "{}: {} tensor '{}': global elements from {} are in no stored chunk "
                        "(the manifest's slices do not cover the tensor)",
                        dir_, kind, tensor, at));
                }
                const int64_t n = std::min(len - done, r->global + r->len - at);
                const float* src = data_of(r->chunk) + r->at + (at - r->global);
                std::copy_n(src, n, dst + (l - begin) + done);
                done += n;
            }
        },
        begin, count);
}

void CheckpointReader::verify_files() const {
    for (const auto& [name, rec] : files_.items()) {
        const std::string path = (fs::path(dir_) / name).string();
        if (!fs::is_regular_file(path)) {
            throw IoError(fmt::format("{}: missing (listed in the manifest)", path));
        }
        const FileDigest d = digest_file(path);
        if (!rec.contains("bytes") || !rec.contains("xxh64") ||
            d.bytes != rec["bytes"].get<uint64_t>()) {
            throw IoError(
                fmt::format("{}: {} bytes, but the manifest records {} (truncated or "
                            "replaced)",
                            path, d.bytes, rec.value("bytes", json()).dump()));
        }
        if (hex(d.xxh64) != rec["xxh64"].get<std::string>()) {
            throw IoError(
                fmt::format("{}: xxh64 {} does not match {} recorded in the manifest "
                            "(the file is corrupted)",
                            path, hex(d.xxh64), rec["xxh64"].get<std::string>()));
        }
    }
}

void CheckpointReader::read_chunk_into(const StoredChunk& c, float* dst) const {
    const size_t nbytes = size_t(c.count) * sizeof(float);
    std::string where = fmt::format("{}/{}", dir_, c.file);
    std::string got;
    if (c.pieces.empty()) {
        // Read and hash block by block: each block is hashed while it is
        // still in cache and the kernel's read-ahead fetches the next.
        constexpr size_t kBlock = size_t(4) << 20;
        XXH64_state_t* st = XXH64_createState();
        XXH64_reset(st, 0);
        char* out = reinterpret_cast<char*>(dst);
        try {
            for (size_t at = 0; at < nbytes; at += kBlock) {
                const size_t n = std::min(kBlock, nbytes - at);
                file(c.file).read_bytes(c.key, at, n, out + at);
                XXH64_update(st, out + at, n);
            }
        } catch (...) {
            XXH64_freeState(st);
            throw;
        }
        got = hex(XXH64_digest(st));
        XXH64_freeState(st);
    } else {
        char* out = reinterpret_cast<char*>(dst);
        size_t at = 0;
        for (const auto& h : c.pieces) {
            const fs::path path = piece_path(blob_dir_of(dir_), h);
            const size_t n = std::min(nbytes - std::min(at, nbytes), size_t(c.piece_bytes));
            std::ifstream in(path, std::ios::binary);
            if (!in || n == 0 || !in.read(out + at, std::streamsize(n)) ||
                piece_name(out + at, n) != h) {
                throw IoError(
                    fmt::format("{}: piece of {} tensor '{}' missing, short or "
                                "corrupted (its content no longer has the hash that "
                                "names it)",
                                path.string(), c.kind, c.tensor));
            }
            at += n;
        }
        if (at != nbytes) {
            throw IoError(fmt::format("{}: {} tensor '{}' has {} bytes in its pieces, {} expected",
                                      dir_, c.kind, c.tensor, at, nbytes));
        }
        where = blob_dir_of(dir_).string();
        if (!c.xxh64.empty()) got = hex(XXH64(dst, nbytes, 0));
    }
    if (!c.xxh64.empty() && got != c.xxh64) {
        throw IoError(
            fmt::format("{}: {} tensor '{}' elements [{}, {}): xxh64 does not match "
                        "the manifest's {} (the file is corrupted)",
                        where, c.kind, c.tensor, c.begin, c.begin + c.count, c.xxh64));
    }
}

std::vector<float> CheckpointReader::chunk_data(const StoredChunk& c) const {
    std::vector<float> buf(size_t(c.count));
    read_chunk_into(c, buf.data());
    return buf;
}

void CheckpointReader::verify_chunks() const {
    for (const auto& c : chunks_) chunk_data(c);
}

std::string CheckpointReader::check_coverage() const {
    for (const auto& [key, ids] : by_tensor_) {
        std::vector<std::pair<int64_t, int64_t>> runs;
        const auto& shape = chunks_[ids.front()].place.global_shape;
        for (size_t ci : ids) {
            const StoredChunk& c = chunks_[ci];
            if (c.place.global_shape != shape) {
                return fmt::format("{} '{}': chunks disagree on the global shape ([{}] vs [{}])",
                                   key.first, key.second, fmt::join(shape, ", "),
                                   fmt::join(c.place.global_shape, ", "));
            }
            c.place.for_each_run(
                [&](int64_t g, int64_t, int64_t len) { runs.emplace_back(g, len); }, c.begin,
                c.count);
        }
        std::sort(runs.begin(), runs.end());
        int64_t next = 0;
        for (const auto& [g, len] : runs) {
            if (g < next) {
                return fmt::format("{} '{}': global elements from {} are stored twice", key.first,
                                   key.second, g);
            }
            if (g > next) {
                return fmt::format("{} '{}': global elements [{}, {}) are stored nowhere",
                                   key.first, key.second, next, g);
            }
            next = g + len;
        }
        int64_t total = 1;
        for (int64_t d : shape) total *= d;
        if (next != total) {
            return fmt::format("{} '{}': global elements [{}, {}) are stored nowhere", key.first,
                               key.second, next, total);
        }
    }
    return "";
}

}  // namespace apiary::ckpt
