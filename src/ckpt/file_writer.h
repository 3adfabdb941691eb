#pragma once
// The one way checkpoint files reach the disk: atomically (a temporary file
// in the same directory, fsync, rename, fsync of the directory: a crash
// leaves the old file or the new one) and hashed as written (xxh64 of the
// file, and of each part if asked), so that a save reads none of its bytes
// twice.
//
// Large files go through a pipeline of three threads over a few aligned
// blocks: the caller copies the parts into a block and hashes each part in
// it, a second thread hashes the block into the file's digest, a third
// writes it with O_DIRECT. Buffered writes cost the writer a copy into the
// page cache and the page cache's own bookkeeping, which on a virtual
// machine is slower than the disk (BENCHMARKS.md, "Checkpoints"); where
// O_DIRECT is refused the same pipeline writes through the page cache.

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/safetensors.h"

namespace apiary::ckpt {

// The bytes of a file, in order, as pieces of memory.
using FileParts = std::vector<std::pair<const void*, size_t>>;

// Writes `parts` to `path` atomically. The digest holds the file's size and
// xxh64 and, for each part from `hash_parts_from` on, that part's own xxh64
// (in FileDigest::tensors). Throws IoError naming the file and the call that
// failed; the temporary file is removed then.
FileDigest write_file_atomically(const std::string& path, const FileParts& parts,
                                 size_t hash_parts_from = SIZE_MAX);

// Where the time of this process's file writes went since the last reset,
// in seconds of wall time of each thread of the pipeline (they overlap:
// their sum exceeds the time of the save). `apiary bench ckpt` prints it.
struct WriteTimes {
    double total_s = 0;      // caller: in write_file_atomically, all told
    double copy_hash_s = 0;  // caller: copying parts into blocks, hashing each part
    double wait_s = 0;       // caller: waiting for a free block (the disk is behind)
    double file_hash_s = 0;  // hashing thread: the file's xxh64
    double write_s = 0;      // writing thread: in write system calls
    double writeback_s = 0;  // writing thread: starting writeback (sync_file_range)
    double sync_s = 0;       // fsync of the file, rename, fsync of the directory
    int64_t bytes = 0, files = 0;
    int64_t direct_files = 0;  // of them, written with O_DIRECT
};
WriteTimes write_times();
void reset_write_times();

}  // namespace apiary::ckpt
