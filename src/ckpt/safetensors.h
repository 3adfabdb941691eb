#pragma once
// safetensors (Hugging Face): an 8-byte little-endian header length, a JSON
// header {name: {dtype, shape, data_offsets}, "__metadata__": {str: str}},
// then the raw little-endian tensor bytes. No code runs on load (unlike a
// pickle), and every offset is checked against the file before use.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace apiary::ckpt {

struct TensorEntry {
    std::string name;
    std::string dtype;  // "F32", "BF16", "F16", "I32", ...
    std::vector<int64_t> shape;
    const void* data = nullptr;  // for writing; into the loaded bytes when read whole
    size_t nbytes = 0;
    uint64_t file_offset = 0;  // when read: where its bytes start in the file
};

// The format's own bound on the JSON header (the Hugging Face reader
// refuses more): a length read from a file is checked against it, and
// against the file's size, before anything is allocated for it.
constexpr uint64_t kMaxHeaderBytes = uint64_t(100) << 20;

// Bytes a tensor of `shape` with elements of `width` bytes takes; false
// when a dimension is negative or the product passes 2^63 (a corrupt or
// hostile shape, whose wrapped product could pass any size check).
bool tensor_bytes(const std::vector<int64_t>& shape, uint64_t width, uint64_t& bytes);

// Size and xxh64 (seed 0) of a file's bytes: what checkpoints record per
// file and check on load.
struct FileDigest {
    uint64_t bytes = 0;
    uint64_t xxh64 = 0;
    bool operator==(const FileDigest& o) const { return bytes == o.bytes && xxh64 == o.xxh64; }
    // write_safetensors only: each tensor's own xxh64, in the order given,
    // hashed in the same pass as the file's while its bytes are in cache.
    std::vector<uint64_t> tensors;
};
// Reads the file through once; throws IoError if it cannot be read.
FileDigest digest_file(const std::string& path);

// Writes atomically: a temporary file in the same directory, fsync, rename,
// fsync of the directory. A crash leaves either the old file or the new one.
// Returns the digest of the bytes written.
FileDigest write_safetensors(const std::string& path, const std::vector<TensorEntry>& tensors,
                             const std::map<std::string, std::string>& metadata);

class SafetensorsFile {
  public:
    // Reads and validates the whole file; throws IoError naming the file and
    // what is wrong (truncated, bad header, overlapping or out-of-range data).
    // header_only: reads and validates the header alone; tensor bytes are
    // then read on demand with read_bytes (sharded checkpoints read only
    // the slices a rank needs).
    explicit SafetensorsFile(const std::string& path, bool header_only = false);
    // n bytes of tensor `name` from byte `offset` within it (pread).
    void read_bytes(const std::string& name, uint64_t offset, size_t n, void* dst) const;

    const std::map<std::string, std::string>& metadata() const { return metadata_; }
    std::vector<std::string> names() const;
    bool has(const std::string& name) const { return entries_.count(name) > 0; }
    const TensorEntry& entry(const std::string& name) const;  // throws IoError if missing
    // Copies an F32 tensor into dst after checking its shape.
    void read_f32(const std::string& name, const std::vector<int64_t>& shape, float* dst) const;
    // Digest of the whole file as read.
    FileDigest digest() const;
    // Any float or integer tensor converted to double (tests, small tensors).
    std::vector<double> read_as_f64(const std::string& name) const;

  private:
    std::string path_;
    bool header_only_ = false;
    // Header-only files keep one descriptor for every read_bytes: the
    // kernel's read-ahead state lives in the open file, so reopening per
    // tensor would restart it small each time and halve the read rate.
    std::shared_ptr<const int> fd_;
    std::vector<uint8_t> bytes_;
    size_t data_start_ = 0;
    std::map<std::string, TensorEntry> entries_;
    std::map<std::string, std::string> metadata_;
};

// Writes `bytes` to `path` atomically (tmp + fsync + rename + dir fsync).
FileDigest atomic_write(const std::string& path, const void* bytes, size_t n);

}  // namespace apiary::ckpt
