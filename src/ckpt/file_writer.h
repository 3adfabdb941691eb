#pragma once
// The one way checkpoint files reach the disk: atomically (a temporary file
// in the same directory, fsync, rename, fsync of the directory: a crash
// leaves the old file or the new one) and hashed as written (xxh64 of the
// file, and of each part if asked), so that a save reads none of its bytes
// twice.
//
// Large files are written through the page cache with at most two windows
// of them there (WindowedWriter): each full window's writeback is started
// at once, and the window before it is waited for and dropped. Left to
// itself the kernel lets a 1.5 GB file pile up dirty, then throttles the
// writer and reclaims while it copies; a save with windows keeps the disk
// busy from its first window and the final fsync has at most two windows
// left to write (BENCHMARKS.md, "Save speed"). The hashes of a large file
// are computed on a second thread, from the caller's memory, while the
// caller writes.

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/safetensors.h"

namespace apiary::ckpt {

// The bytes of a file, in order, as pieces of memory.
using FileParts = std::vector<std::pair<const void*, size_t>>;

// Bytes of the file kept in the page cache at once, per window (two at most).
inline constexpr size_t kWriteWindow = size_t(64) << 20;

// Writes `parts` to `path` atomically. The digest holds the file's size and
// xxh64 and, for each part from `hash_parts_from` on, that part's own xxh64
// (in FileDigest::tensors). `window` is WindowedWriter's (tests make it
// small). Throws IoError naming the file and the call that failed; the
// temporary file is removed then and a file already at `path` is untouched.
FileDigest write_file_atomically(const std::string& path, const FileParts& parts,
                                 size_t hash_parts_from = SIZE_MAX, size_t window = kWriteWindow);

// Sequential writes to an open file that keep at most two `window`-byte
// windows of it in the page cache. When a window is full its writeback is
// started (sync_file_range WRITE); the previous window is then waited for
// (WAIT_BEFORE | WRITE | WAIT_AFTER) and dropped (POSIX_FADV_DONTNEED).
// Where the filesystem does not support sync_file_range (EINVAL, ENOSYS,
// ESPIPE, EOPNOTSUPP) it goes on with plain writes; any other failure
// throws IoError naming the file. (tmpfs accepts both calls and does
// nothing: its pages are the file.) The caller still fsyncs: the last two
// windows may be dirty.
class WindowedWriter {
  public:
    // `fd`: open for writing at offset 0, owned by the caller. `path` names
    // the file in errors. `window` > 0 (a multiple of the page size, or the
    // drops leave the pages at the edges).
    WindowedWriter(int fd, std::string path, size_t window = kWriteWindow);

    void write(const void* p, size_t n);

    uint64_t bytes() const { return bytes_; }
    // False once the filesystem refused sync_file_range (or never written
    // past a window).
    bool windowed() const { return windowed_; }

  private:
    void window_done();

    int fd_;
    std::string path_;
    size_t window_;
    uint64_t bytes_ = 0;
    uint64_t window_start_ = 0;  // offset of the window being written
    int64_t in_writeback_ = -1;  // offset of the window whose writeback was started
    bool supported_ = true, windowed_ = false;
};

// Where the time of this process's file writes went since the last reset,
// in seconds of wall time. The hashing of a large file runs on its own
// thread beside the writes (hash_s overlaps write_s; hash_wait_s is what
// the writer then waited for it); the other phases are on the writing
// thread and add up to total_s with it. `apiary bench ckpt` prints them.
struct WriteTimes {
    double total_s = 0;      // in write_file_atomically, all told
    double write_s = 0;      // write system calls (the copy into the page cache)
    double hash_s = 0;       // xxh64 of the file and of its parts (own thread when large)
    double hash_wait_s = 0;  // the writer waiting for the hashing thread after its writes
    double writeback_s = 0;  // starting a window's writeback (sync_file_range WRITE)
    double wait_drop_s = 0;  // waiting for the previous window's writeback, and dropping it
    double sync_s = 0;       // fsync of the file, rename, fsync of the directory
    int64_t bytes = 0, files = 0;
    int64_t windowed_files = 0;  // of them, written through WindowedWriter's windows
};
WriteTimes write_times();
void reset_write_times();

}  // namespace apiary::ckpt
