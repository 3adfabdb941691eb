#pragma once
// Small file helpers with the error messages and atomicity data/ relies on.

#include <cstdint>
#include <string>
#include <string_view>

namespace apiary::data {

// Whole file; IoError naming the path when it cannot be read.
std::string read_file(const std::string& path);
// The same for a file whose size is not known in advance (a manifest, a
// tokenizer), bounded: a device or directory is refused unread, a regular
// file over max_bytes too, and a pipe is read up to max_bytes. `what`
// names it in the message ("manifest").
std::string read_file(const std::string& path, uint64_t max_bytes, const char* what);
// Sane bounds on what data/ reads whole.
inline constexpr uint64_t kMaxManifestBytes = uint64_t(256) << 20;
inline constexpr uint64_t kMaxTokenizerBytes = uint64_t(256) << 20;
// Writes to `path.tmp`, fsyncs, renames over `path`, fsyncs the directory: a
// reader sees either the old file or the complete new one, never a prefix.
void write_file_atomic(const std::string& path, std::string_view data);
uint64_t xxhash64(const void* data, size_t n, uint64_t seed = 0);
// xxhash64 (seed 0) of a whole file, streamed in bounded memory.
uint64_t xxhash64_file(const std::string& path);
// Hash as 16 lowercase hex digits, the form manifests store.
std::string hex64(uint64_t h);

// Why `path` cannot serve as a text input (a corpus, a file to prepare),
// for a message "<what>: '<path>' <why>": "does not exist", "is a
// directory", "is not readable: <reason>", "is empty" (also /dev/null and
// other devices or pipes that give nothing), or "is not a regular file ..."
// (a device or pipe with content: inputs are read more than once). ""
// when it can.
std::string unusable_input(const std::string& path);

}  // namespace apiary::data
