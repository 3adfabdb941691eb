#include "sim/text.h"

#include <fmt/format.h>
#include <zlib.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace apiary::sim {

std::string cell_message(const Cell& c, const std::string& problem) {
    // Bytes outside printable ASCII are shown escaped, never raw.
    return fmt::format("{}: field '{}': '{}' {}", c.where, printable(c.field, 80),
                       printable(c.text, 80), problem);
}

bool parse_double(const std::string& s, double* out) {
    const std::string t = trim(s);
    if (t.empty()) return false;
    const char* b = t.data();
    if (*b == '+') ++b;
    double v = 0;
    auto [p, ec] = std::from_chars(b, t.data() + t.size(), v);
    if (ec != std::errc() || p != t.data() + t.size() || !std::isfinite(v)) return false;
    *out = v;
    return true;
}

double cell_number(const Cell& c, double lo, double hi, const char* what) {
    double v = 0;
    if (!parse_double(c.text, &v)) {
        throw DataError(cell_message(c, fmt::format("is not a number ({})", what)));
    }
    if (v < lo) {
        throw DataError(
            cell_message(c, fmt::format("is {} ({})", v < 0 ? "negative" : "too small", what)));
    }
    if (v > hi) throw DataError(cell_message(c, fmt::format("is too large ({})", what)));
    return v;
}

double cell_integer(const Cell& c, double lo, double hi, const char* what) {
    const double v = cell_number(c, lo, hi, what);
    if (v != std::floor(v)) {
        throw DataError(cell_message(c, fmt::format("is not a whole number ({})", what)));
    }
    return v;
}

bool cell_bool(const Cell& c) {
    std::string t = c.text;
    std::transform(t.begin(), t.end(), t.begin(),
                   [](unsigned char ch) { return std::tolower(ch); });
    if (t == "1" || t == "true" || t == "yes") return true;
    if (t == "0" || t == "false" || t == "no") return false;
    throw DataError(cell_message(c, "is not a boolean (0/1, true/false, yes/no)"));
}

std::string trim(const std::string& s) {
    const size_t b = s.find_first_not_of(" \t\r\n");
    if (b == std::string::npos) return "";
    const size_t e = s.find_last_not_of(" \t\r\n");
    return s.substr(b, e - b + 1);
}

bool strip_bom(std::string& text) {
    if (text.compare(0, 3, "\xEF\xBB\xBF") != 0) return false;
    text.erase(0, 3);
    return true;
}

std::vector<std::string> split_lines(const std::string& text) {
    std::vector<std::string> lines;
    // A byte-order mark is not part of the first line (readers that note it
    // strip it first; the others accept it silently).
    size_t start = text.compare(0, 3, "\xEF\xBB\xBF") == 0 ? 3 : 0;
    while (start < text.size()) {
        size_t end = text.find('\n', start);
        if (end == std::string::npos) end = text.size();
        std::string line = text.substr(start, end - start);
        if (!line.empty() && line.back() == '\r') line.pop_back();
        lines.push_back(std::move(line));
        start = end + 1;
    }
    return lines;
}

bool is_blank_or_comment(const std::string& line) {
    const std::string t = trim(line);
    return t.empty() || t[0] == '#';
}

std::vector<std::string> split_csv(const std::string& line, const std::string& where) {
    std::vector<std::string> cells(1);
    bool quoted = false;
    for (size_t i = 0; i < line.size(); ++i) {
        const char ch = line[i];
        if (quoted) {
            if (ch == '"' && i + 1 < line.size() && line[i + 1] == '"') {
                cells.back() += '"';
                ++i;
            } else if (ch == '"') {
                quoted = false;
            } else {
                cells.back() += ch;
            }
        } else if (ch == '"') {
            quoted = true;
        } else if (ch == ',') {
            cells.emplace_back();
        } else {
            cells.back() += ch;
        }
    }
    if (quoted) throw DataError(fmt::format("{}: unterminated quote", where));
    return cells;
}

std::string csv_quote(const std::string& v, bool always) {
    if (!always && v.find_first_of(",\"\r\n") == std::string::npos) return v;
    std::string q = "\"";
    for (char c : v) {
        if (c == '"') q += '"';
        q += c;
    }
    return q + "\"";
}

std::vector<std::string> split(const std::string& s, char sep) {
    std::vector<std::string> out;
    std::string cur;
    for (char ch : s) {
        if (ch == sep) {
            out.push_back(cur);
            cur.clear();
        } else {
            cur += ch;
        }
    }
    out.push_back(cur);
    return out;
}

namespace {
size_t edit_distance(const std::string& a, const std::string& b) {
    std::vector<size_t> row(b.size() + 1);
    for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= b.size(); ++j) {
            const size_t up = row[j];
            row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] != b[j - 1])});
            diag = up;
        }
    }
    return row[b.size()];
}
}  // namespace

std::string closest(const std::string& name, const std::vector<std::string>& names) {
    std::string best;
    size_t best_d = std::max<size_t>(2, name.size() / 3) + 1;
    for (const auto& n : names) {
        const size_t d = edit_distance(name, n);
        if (d < best_d) best_d = d, best = n;
    }
    return best;
}

std::string read_text_file(const std::string& path, const char* what) {
    // Read whole, so bounded: a device (/dev/zero is endless) or a directory
    // is refused unread, and a file or pipe stops at kMaxBytes.
    namespace fs = std::filesystem;
    constexpr uint64_t kMaxBytes = uint64_t(1) << 30;
    std::error_code ec;
    const auto st = fs::status(path, ec);
    if (fs::is_character_file(st) || fs::is_block_file(st) || fs::is_directory(st)) {
        throw IoError(
            fmt::format("{}: '{}' is not a regular file (a device or directory, or a "
                        "symlink to one)",
                        what, path));
    }
    if (fs::is_regular_file(st) && fs::file_size(path, ec) > kMaxBytes) {
        throw IoError(
            fmt::format("{}: '{}' has {} bytes, more than the {} bytes apiary reads as "
                        "one {}",
                        what, path, fs::file_size(path, ec), kMaxBytes, what));
    }
    std::ifstream in(path, std::ios::binary);
    if (!in) throw IoError(fmt::format("{}: cannot read '{}'", what, path));
    std::string text;
    std::vector<char> buf(size_t(1) << 16);
    while (in.read(buf.data(), std::streamsize(buf.size())) || in.gcount() > 0) {
        text.append(buf.data(), size_t(in.gcount()));
        if (text.size() > kMaxBytes) {
            throw IoError(fmt::format("{}: '{}' has more than the {} bytes apiary reads as one {}",
                                      what, path, kMaxBytes, what));
        }
    }
    return text;
}

}  // namespace apiary::sim

namespace apiary::sim {

std::string printable(const std::string& s, size_t max_chars) {
    std::string out;
    for (size_t i = 0; i < s.size(); ++i) {
        if (out.size() >= max_chars) {
            out += "...";
            break;
        }
        const unsigned char c = static_cast<unsigned char>(s[i]);
        if (c >= 0x20 && c < 0x7f) {
            out += char(c);
        } else {
            out += fmt::format("\\x{:02x}", c);
        }
    }
    return out;
}

bool is_gzip(const std::string& data) {
    return data.size() >= 2 && static_cast<unsigned char>(data[0]) == 0x1f &&
           static_cast<unsigned char>(data[1]) == 0x8b;
}

std::string gunzip(const std::string& data, const std::string& path, const char* what) {
    constexpr size_t kMaxBytes = size_t(1) << 30;
    std::string out;
    z_stream z{};
    // 15 + 32: a zlib or gzip header, detected.
    if (inflateInit2(&z, 15 + 32) != Z_OK) {
        throw IoError(fmt::format("{}: '{}': zlib cannot start inflating", what, path));
    }
    z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
    z.avail_in = uInt(data.size());
    std::vector<char> buf(size_t(1) << 16);
    int rc = Z_OK;
    auto lines = [&] { return std::count(out.begin(), out.end(), '\n') + 1; };
    while (true) {
        z.next_out = reinterpret_cast<Bytef*>(buf.data());
        z.avail_out = uInt(buf.size());
        rc = inflate(&z, Z_NO_FLUSH);
        out.append(buf.data(), buf.size() - z.avail_out);
        if (out.size() > kMaxBytes) {
            inflateEnd(&z);
            throw IoError(
                fmt::format("{}: '{}' inflates to more than {} bytes", what, path, kMaxBytes));
        }
        if (rc == Z_STREAM_END) {
            // Concatenated gzip members (as `cat a.gz b.gz` makes) are one file.
            if (z.avail_in == 0) break;
            inflateReset(&z);
            continue;
        }
        if (rc == Z_OK) continue;
        if (rc == Z_BUF_ERROR && z.avail_in == 0) {
            inflateEnd(&z);
            throw DataError(fmt::format(
                "{}:{}: truncated gzip stream: the compressed data ends before the end of the "
                "file it holds ({} bytes read, {} bytes of text recovered)",
                path, lines(), data.size(), out.size()));
        }
        const std::string msg = z.msg ? z.msg : "error " + std::to_string(rc);
        inflateEnd(&z);
        throw DataError(fmt::format("{}:{}: corrupt gzip data ({}) after {} bytes of text", path,
                                    lines(), msg, out.size()));
    }
    inflateEnd(&z);
    return out;
}

void with_printable_errors(const std::function<void()>& read) {
    const size_t all = std::string::npos;
    try {
        read();
    } catch (const DataError& e) {
        throw DataError(printable(e.what(), all));
    } catch (const ConfigError& e) {
        throw ConfigError(printable(e.what(), all));
    } catch (const IoError& e) {
        throw IoError(printable(e.what(), all));
    }
}

void for_each_csv_row(
    const std::string& text, const std::string& source,
    const std::function<void(std::vector<std::string>& cells, const std::string& where)>& row) {
    int line_no = 0;
    for (const auto& line : split_lines(text)) {
        ++line_no;
        if (is_blank_or_comment(line)) continue;
        const std::string where = fmt::format("{}:{}", source, line_no);
        auto cells = split_csv(line, where);
        for (auto& c : cells) c = trim(c);
        row(cells, where);
    }
}

}  // namespace apiary::sim
