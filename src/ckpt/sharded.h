#pragma once
// The sharded checkpoint format (docs/formats.md, "Checkpoints"): a
// directory per step with one safetensors file per rank, holding only what
// that rank owns, and a manifest.json that says where every slice of every
// global tensor is. No rank materialises the whole state to save or load:
// a rank writes its chunks, and reads back exactly the slices its new place
// in any other layout needs (resharding on load), each verified by its
// chunk's xxh64.
//
// A chunk is a contiguous range [begin, begin + count) of the elements of a
// rank's local part of a tensor, whose place in the global tensor is a
// core::Placement; every (tensor, kind) must be covered exactly once over
// the chunks of all ranks.

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ckpt/safetensors.h"
#include "core/placement.h"

namespace apiary::ckpt {

constexpr const char* kManifestFile = "manifest.json";

// What a rank writes.
struct Chunk {
    std::string tensor;  // global name
    std::string kind;    // "param", "adam_m", "adam_v"
    core::Placement place;
    int64_t begin = 0, count = 0;  // local elements
    const float* data = nullptr;   // count floats
};

// Writes `file` in `dir` (atomically) with the chunks' floats; returns its
// part of the manifest: {"file", "bytes", "xxh64", "chunks": [...]}.
nlohmann::json write_chunks(const std::string& dir, const std::string& file,
                            const std::vector<Chunk>& chunks);

// Incremental saves: each chunk's bytes are cut into pieces of piece_bytes,
// each stored once as a file named by its XXH3-128 content hash under
// blob_dir (<run>/ckpt/blobs/ab/<hash>); a piece an earlier save already
// stored (the same bytes) is referred to, not written again. Returns the
// rank's manifest part (chunks listing their pieces) with "bytes_written"
// and "bytes_reused".
nlohmann::json write_chunks_incremental(const std::string& blob_dir,
                                        const std::vector<Chunk>& chunks, int64_t piece_bytes);

// Removes every piece under blob_dir that none of the given checkpoint
// directories' manifests refers to; returns how many were removed.
int64_t remove_unreferenced_pieces(const std::string& blob_dir,
                                   const std::vector<std::string>& kept_dirs);

// Writes manifest.json from every rank's part and the checkpoint's own
// description (step, model, layout, data and optimizer state...), which
// becomes its top level. Atomic; called after every rank's file is on disk.
void write_manifest(const std::string& dir, const std::vector<nlohmann::json>& parts,
                    nlohmann::json meta);

// A checkpoint directory opened for reading: the manifest is parsed and
// checked (file names inside the directory, placements, chunk ranges) but
// no tensor data is read until asked for.
class CheckpointReader {
  public:
    explicit CheckpointReader(const std::string& dir);
    ~CheckpointReader();
    const std::string& dir() const { return dir_; }
    // The manifest without its file and chunk lists.
    const nlohmann::json& meta() const { return meta_; }
    // Global tensor names stored for `kind`, sorted.
    std::vector<std::string> tensors(const std::string& kind) const;
    bool has(const std::string& kind, const std::string& tensor) const;
    // The global shape of a stored tensor.
    std::vector<int64_t> global_shape(const std::string& kind, const std::string& tensor) const;
    // Fills dst (count floats) with the local elements [begin, begin +
    // count) of `tensor` placed as `want` describes, reading only the stored
    // chunks that overlap them and checking each chunk's xxh64. Throws
    // IoError naming the tensor and the first missing global range.
    void read(const std::string& kind, const std::string& tensor, const core::Placement& want,
              int64_t begin, int64_t count, float* dst) const;
    // Every file's size and xxh64 against the manifest (reads every file).
    void verify_files() const;
    // Every chunk's xxh64 against the manifest (reads every chunk).
    void verify_chunks() const;
    // Every (tensor, kind) covered exactly once; "" or the first problem.
    std::string check_coverage() const;
    // Files and their recorded bytes.
    const nlohmann::json& files() const { return files_; }
    size_t num_chunks() const { return chunks_.size(); }
    // Stored as content-addressed pieces (an incremental save).
    bool incremental() const { return !chunks_.empty() && !chunks_.front().pieces.empty(); }

  private:
    struct StoredChunk {
        std::string tensor, kind, file, key;
        std::vector<std::string> pieces;  // incremental: content hashes, in order
        int64_t piece_bytes = 0;
        core::Placement place;
        int64_t begin = 0, count = 0;
        std::string xxh64;  // empty: checked by the whole file's digest (version 1)
    };
    const SafetensorsFile& file(const std::string& name) const;
    // A stored chunk's floats, checked against its xxh64.
    std::vector<float> chunk_data(const StoredChunk& c) const;
    void open_v1();
    std::string dir_;
    nlohmann::json meta_, files_;
    std::vector<StoredChunk> chunks_;
    std::map<std::pair<std::string, std::string>, std::vector<size_t>>
        by_tensor_;  // (kind, tensor)
    mutable std::map<std::string, std::unique_ptr<SafetensorsFile>> open_;
};

}  // namespace apiary::ckpt
