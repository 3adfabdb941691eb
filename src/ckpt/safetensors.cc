#include "ckpt/safetensors.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <thread>

#include "ckpt/file_writer.h"
#include "core/error.h"

namespace apiary::ckpt {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

size_t dtype_bytes(const std::string& dt) {
    if (dt == "F64" || dt == "I64" || dt == "U64") return 8;
    if (dt == "F32" || dt == "I32" || dt == "U32") return 4;
    if (dt == "F16" || dt == "BF16" || dt == "I16" || dt == "U16") return 2;
    if (dt == "I8" || dt == "U8" || dt == "BOOL") return 1;
    return 0;
}

}  // namespace

FileDigest atomic_write(const std::string& path, const void* bytes, size_t n) {
    return write_file_atomically(path, {{bytes, n}});
}

FileDigest digest_file(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw IoError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
    XXH64_state_t* state = XXH64_createState();
    XXH64_reset(state, 0);
    FileDigest d;
    std::vector<char> buf(size_t(4) << 20);
    for (;;) {
        const ssize_t n = ::read(fd, buf.data(), buf.size());
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            const int err = errno;
            XXH64_freeState(state);
            ::close(fd);
            throw IoError(fmt::format("{}: read failed: {}", path, std::strerror(err)));
        }
        if (n == 0) break;
        XXH64_update(state, buf.data(), size_t(n));
        d.bytes += uint64_t(n);
    }
    d.xxh64 = XXH64_digest(state);
    XXH64_freeState(state);
    ::close(fd);
    return d;
}

FileDigest write_safetensors(const std::string& path, const std::vector<TensorEntry>& tensors,
                             const std::map<std::string, std::string>& metadata) {
    json header = json::object();
    if (!metadata.empty()) header["__metadata__"] = metadata;
    size_t offset = 0;
    for (const auto& t : tensors) {
        header[t.name] = {
            {"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.nbytes}}};
        offset += t.nbytes;
    }
    std::string h = header.dump();
    // Pad the header with spaces so tensor data starts 8-byte aligned.
    while ((8 + h.size()) % 8 != 0) h += ' ';
    const uint64_t hlen = h.size();
    FileParts parts = {{&hlen, 8}, {h.data(), h.size()}};
    for (const auto& t : tensors) parts.emplace_back(t.data, t.nbytes);
    return write_file_atomically(path, parts, 2);
}

bool tensor_bytes(const std::vector<int64_t>& shape, uint64_t width, uint64_t& bytes) {
    uint64_t n = width;
    for (int64_t d : shape) {
        if (d < 0 || __builtin_mul_overflow(n, uint64_t(d), &n)) return false;
    }
    if (n > uint64_t(INT64_MAX)) return false;
    bytes = n;
    return true;
}

SafetensorsFile::SafetensorsFile(const std::string& path, bool header_only) : path_(path) {
    std::error_code ec;
    if (fs::exists(path, ec) && !fs::is_regular_file(path, ec)) {
        // A device or pipe has no size to check lengths against (and
        // /dev/zero would read forever).
        throw IoError(
            fmt::format("{}: not a regular file (a device, pipe or directory, or a "
                        "symlink to one): give the safetensors file itself",
                        path));
    }
    std::ifstream in(path, std::ios::binary | std::ios::ate);
    if (!in) throw IoError(fmt::format("{}: cannot open", path));
    const auto size = size_t(in.tellg());
    if (size < 8) {
        throw IoError(fmt::format("{}: {} bytes is too short for a safetensors file", path, size));
    }
    uint64_t hlen = 0;
    in.seekg(0);
    in.read(reinterpret_cast<char*>(&hlen), 8);
    if (!in) throw IoError(fmt::format("{}: read failed", path));
    // Checked before a byte more is read or allocated: a hostile length
    // would otherwise size the buffer.
    if (hlen > kMaxHeaderBytes || hlen > size - 8) {
        throw IoError(fmt::format(
            "{}: the header length at byte 0 declares {} bytes, but {} (the safetensors limit "
            "is {} bytes, and the file has {} bytes after the length): not a safetensors file, "
            "or truncated",
            path, hlen, hlen > size - 8 ? "the file is shorter" : "that is over the limit",
            kMaxHeaderBytes, size - 8));
    }
    const size_t keep = header_only ? size_t(8 + hlen) : size;
    bytes_.resize(keep);
    in.seekg(0);
    in.read(reinterpret_cast<char*>(bytes_.data()), std::streamsize(keep));
    if (!in) throw IoError(fmt::format("{}: read failed", path));
    header_only_ = header_only;
    if (header_only) {
        const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0) throw IoError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
        ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
        fd_ = std::shared_ptr<const int>(new int(fd), [](const int* p) {
            ::close(*p);
            delete p;
        });
    }
    data_start_ = 8 + hlen;
    json header;
    try {
        header = json::parse(bytes_.begin() + 8, bytes_.begin() + long(data_start_));
    } catch (const json::parse_error& e) {
        throw IoError(
            fmt::format("{}: header is not valid JSON (byte {}): {}", path, 8 + e.byte, e.what()));
    }
    if (!header.is_object()) throw IoError(fmt::format("{}: header is not a JSON object", path));
    const size_t data_size = size - data_start_;
    std::vector<std::pair<size_t, size_t>> ranges;
    for (const auto& [name, v] : header.items()) {
        if (name == "__metadata__") {
            if (!v.is_object())
                throw IoError(fmt::format("{}: __metadata__ is not an object", path));
            for (const auto& [mk, mv] : v.items()) {
                if (!mv.is_string()) {
                    throw IoError(fmt::format("{}: metadata '{}' is not a string", path, mk));
                }
                metadata_[mk] = mv.get<std::string>();
            }
            continue;
        }
        try {
            TensorEntry e;
            e.name = name;
            e.dtype = v.at("dtype").get<std::string>();
            e.shape = v.at("shape").get<std::vector<int64_t>>();
            const auto offs = v.at("data_offsets").get<std::vector<uint64_t>>();
            const size_t width = dtype_bytes(e.dtype);
            if (width == 0) throw IoError(fmt::format("unknown dtype '{}'", e.dtype));
            if (offs.size() != 2 || offs[0] > offs[1] || offs[1] > data_size) {
                throw IoError(fmt::format("data_offsets [{}] outside the {} data bytes",
                                          fmt::join(offs, ", "), data_size));
            }
            uint64_t need = 0;
            if (!tensor_bytes(e.shape, width, need)) {
                throw IoError(fmt::format(
                    "shape [{}] of {} has a negative dimension or needs more than 2^63 bytes",
                    fmt::join(e.shape, ", "), e.dtype));
            }
            if (need != offs[1] - offs[0]) {
                throw IoError(
                    fmt::format("shape [{}] of {} needs {} bytes but data_offsets span {}",
                                fmt::join(e.shape, ", "), e.dtype, need, offs[1] - offs[0]));
            }
            e.data = header_only ? nullptr : bytes_.data() + data_start_ + offs[0];
            e.nbytes = offs[1] - offs[0];
            e.file_offset = data_start_ + offs[0];
            ranges.emplace_back(offs[0], offs[1]);
            entries_[name] = std::move(e);
        } catch (const json::exception& ex) {
            throw IoError(
                fmt::format("{}: tensor '{}': malformed entry: {}", path, name, ex.what()));
        } catch (const IoError& ex) {
            throw IoError(fmt::format("{}: tensor '{}': {}", path, name, ex.what()));
        }
    }
    std::sort(ranges.begin(), ranges.end());
    for (size_t i = 1; i < ranges.size(); ++i) {
        if (ranges[i].first < ranges[i - 1].second) {
            throw IoError(
                fmt::format("{}: tensors overlap at data byte {}", path, ranges[i].first));
        }
    }
}

void SafetensorsFile::read_bytes(const std::string& name, uint64_t offset, size_t n,
                                 void* dst) const {
    const TensorEntry& e = entry(name);
    if (offset + n > e.nbytes) {
        throw IoError(fmt::format("{}: bytes [{}, {}) of tensor '{}' ({} bytes)", path_, offset,
                                  offset + n, name, e.nbytes));
    }
    if (!header_only_) {
        std::memcpy(dst, static_cast<const char*>(e.data) + offset, n);
        return;
    }
    if (!fd_) {
        throw IoError(fmt::format("{}: not open for reading", path_));
    }
    const int fd = *fd_;
    size_t done = 0;
    while (done < n) {
        const ssize_t r = ::pread(fd, static_cast<char*>(dst) + done, n - done,
                                  off_t(e.file_offset + offset + done));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            const int err = r < 0 ? errno : 0;
            throw IoError(fmt::format("{}: reading tensor '{}' failed: {}", path_, name,
                                      err ? std::strerror(err) : "unexpected end of file"));
        }
        done += size_t(r);
    }
}

FileDigest SafetensorsFile::digest() const {
    APIARY_CHECK(!header_only_, "{}: digest of a file read header-only", path_);
    return {uint64_t(bytes_.size()), XXH64(bytes_.data(), bytes_.size(), 0), {}};
}

std::vector<std::string> SafetensorsFile::names() const {
    std::vector<std::string> n;
    for (const auto& [k, v] : entries_) n.push_back(k);
    return n;
}

const TensorEntry& SafetensorsFile::entry(const std::string& name) const {
    auto it = entries_.find(name);
    if (it == entries_.end()) {
        throw IoError(fmt::format("{}: no tensor named '{}'", path_, name));
    }
    return it->second;
}

void SafetensorsFile::read_f32(const std::string& name, const std::vector<int64_t>& shape,
                               float* dst) const {
    const TensorEntry& e = entry(name);
    if (e.dtype != "F32") {
        throw IoError(fmt::format("{}: tensor '{}' is {}, expected F32", path_, name, e.dtype));
    }
    if (e.shape != shape) {
        throw IoError(fmt::format("{}: tensor '{}' has shape [{}], expected [{}]", path_, name,
                                  fmt::join(e.shape, ", "), fmt::join(shape, ", ")));
    }
    read_bytes(name, 0, e.nbytes, dst);
}

std::vector<double> SafetensorsFile::read_as_f64(const std::string& name) const {
    const TensorEntry& e = entry(name);
    const size_t width = dtype_bytes(e.dtype);
    const size_t n = e.nbytes / width;
    std::vector<double> out(n);
    std::vector<uint8_t> raw(e.nbytes);
    read_bytes(name, 0, e.nbytes, raw.data());
    const uint8_t* p = raw.data();
    for (size_t i = 0; i < n; ++i) {
        const uint8_t* q = p + i * width;
        if (e.dtype == "F64") {
            double d;
            std::memcpy(&d, q, 8);
            out[i] = d;
        } else if (e.dtype == "F32") {
            float f;
            std::memcpy(&f, q, 4);
            out[i] = f;
        } else if (e.dtype == "I32") {
            int32_t v;
            std::memcpy(&v, q, 4);
            out[i] = v;
        } else if (e.dtype == "I64") {
            int64_t v;
            std::memcpy(&v, q, 8);
            out[i] = double(v);
        } else {
            throw IoError(
                fmt::format("{}: tensor '{}': cannot read {} as numbers", path_, name, e.dtype));
        }
    }
    return out;
}

}  // namespace apiary::ckpt
