#include "data/documents.h"

#include <fcntl.h>
#include <unistd.h>
#include <zstd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/pretokenize.h"

namespace apiary::data {

namespace {

bool ends_with(const std::string& s, std::string_view suffix) {
    return s.size() >= suffix.size() &&
           s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Raw bytes of a file, decompressing zstd on the fly.
class ByteSource {
  public:
    explicit ByteSource(const std::string& path) : path_(path), zstd_(ends_with(path, ".zst")) {
        fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd_ < 0) throw IoError(fmt::format("cannot open '{}': {}", path, std::strerror(errno)));
        if (zstd_) {
            dctx_ = ZSTD_createDCtx();
            in_.resize(ZSTD_DStreamInSize());
        }
    }
    ~ByteSource() {
        if (dctx_) ZSTD_freeDCtx(dctx_);
        if (fd_ >= 0) ::close(fd_);
    }
    ByteSource(const ByteSource&) = delete;
    ByteSource& operator=(const ByteSource&) = delete;

    // Appends up to `max` bytes to out; returns false at end of file.
    bool read(std::string& out, size_t max) {
        if (!zstd_) {
            const size_t old = out.size();
            out.resize(old + max);
            const ssize_t n = raw_read(out.data() + old, max);
            out.resize(old + static_cast<size_t>(n));
            return n > 0;
        }
        for (;;) {
            if (in_pos_ == in_len_) {
                const ssize_t n = raw_read(in_.data(), in_.size());
                if (n == 0) {
                    if (!frame_done_) {
                        throw DataError(
                            fmt::format("'{}': zstd stream truncated at compressed "
                                        "byte {}",
                                        path_, raw_offset_));
                    }
                    return false;
                }
                in_len_ = static_cast<size_t>(n);
                in_pos_ = 0;
            }
            const size_t old = out.size();
            out.resize(old + max);
            ZSTD_inBuffer ib{in_.data(), in_len_, in_pos_};
            ZSTD_outBuffer ob{out.data() + old, max, 0};
            const size_t r = ZSTD_decompressStream(dctx_, &ob, &ib);
            if (ZSTD_isError(r)) {
                throw DataError(fmt::format("'{}': corrupt zstd data near compressed byte {}: {}",
                                            path_, raw_offset_ - (in_len_ - ib.pos),
                                            ZSTD_getErrorName(r)));
            }
            frame_done_ = r == 0;
            in_pos_ = ib.pos;
            out.resize(old + ob.pos);
            if (ob.pos > 0) return true;
        }
    }

  private:
    ssize_t raw_read(char* buf, size_t n) {
        for (;;) {
            const ssize_t r = ::read(fd_, buf, n);
            if (r >= 0) {
                raw_offset_ += static_cast<size_t>(r);
                return r;
            }
            if (errno != EINTR) {
                throw IoError(fmt::format("cannot read '{}' at byte {}: {}", path_, raw_offset_,
                                          std::strerror(errno)));
            }
        }
    }
    std::string path_;
    bool zstd_;
    int fd_ = -1;
    ZSTD_DCtx* dctx_ = nullptr;
    std::string in_;
    size_t in_pos_ = 0, in_len_ = 0, raw_offset_ = 0;
    bool frame_done_ = true;
};

void text_pieces(ByteSource& src, const DocumentOptions& options, const PieceFn& fn) {
    std::string buf;
    bool first = true, more = true;
    size_t want = options.block_bytes;
    while (more || !buf.empty()) {
        while (more && buf.size() < want) more = src.read(buf, options.block_bytes);
        // Emit up to a safe split point (preferably in the second half) and
        // keep the tail. Without one, read up to 4 blocks before cutting
        // anyway: text with no space after a letter for that long may then
        // tokenize differently at the cut, but still round-trips.
        size_t cut = buf.size();
        if (more) {
            size_t p = safe_split_point(buf, buf.size() / 2);
            if (p == buf.size()) p = safe_split_point(buf, 1);
            if (p < buf.size()) {
                cut = p;
            } else if (want < 4 * options.block_bytes) {
                want *= 2;
                continue;
            }
        }
        fn(std::string_view(buf).substr(0, cut), first);
        first = false;
        buf.erase(0, cut);
        want = options.block_bytes;
    }
    if (first) fn(std::string_view(), true);  // an empty file is an empty document
}

void jsonl_pieces(ByteSource& src, const std::string& path, const DocumentOptions& options,
                  const PieceFn& fn) {
    std::string buf;
    size_t line_no = 0;
    bool more = true;
    while (more || !buf.empty()) {
        size_t nl = buf.find('\n');
        while (nl == std::string::npos && more) {
            const size_t old = buf.size();
            more = src.read(buf, options.block_bytes);
            nl = buf.find('\n', old);
        }
        const size_t end = nl == std::string::npos ? buf.size() : nl;
        std::string_view line(buf.data(), end);
        ++line_no;
        if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
        if (line.find_first_not_of(" \t") != std::string_view::npos) {
            nlohmann::json j;
            try {
                j = nlohmann::json::parse(line);
            } catch (const nlohmann::json::parse_error& e) {
                throw DataError(
                    fmt::format("'{}' line {}: not JSON at column {}; each line of a "
                                ".jsonl file must be one JSON object",
                                path, line_no, e.byte));
            }
            if (!j.is_object() || !j.contains(options.jsonl_field) ||
                !j[options.jsonl_field].is_string()) {
                throw DataError(
                    fmt::format("'{}' line {}: no string field '{}' (set "
                                "--jsonl-field)",
                                path, line_no, options.jsonl_field));
            }
            fn(j[options.jsonl_field].get_ref<const std::string&>(), true);
        }
        buf.erase(0, nl == std::string::npos ? buf.size() : nl + 1);
    }
}

}  // namespace

void for_each_piece(const std::string& path, const DocumentOptions& options, const PieceFn& fn) {
    ByteSource src(path);
    std::string inner = ends_with(path, ".zst") ? path.substr(0, path.size() - 4) : path;
    if (ends_with(inner, ".jsonl") || ends_with(inner, ".json")) {
        jsonl_pieces(src, path, options, fn);
    } else {
        text_pieces(src, options, fn);
    }
}

void for_each_block(const std::string& path, const DocumentOptions& options,
                    const std::function<void(std::string_view)>& fn) {
    for_each_piece(path, options, [&](std::string_view text, bool) { fn(text); });
}

}  // namespace apiary::data
