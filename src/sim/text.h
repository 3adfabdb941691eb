#pragma once
// Text helpers shared by the trace, profile and Slurm readers: cells that
// know where they came from, so every parse error names file, line and field.

#include <functional>
#include <string>
#include <vector>

namespace apiary::sim {

struct Cell {
    std::string text;
    std::string where;  // "file:line"
    std::string field;
};

// "<where>: field '<field>': '<text>' <problem>"
std::string cell_message(const Cell& c, const std::string& problem);
// A finite number in [lo, hi]; `what` says what would work.
double cell_number(const Cell& c, double lo, double hi, const char* what);
double cell_integer(const Cell& c, double lo, double hi, const char* what);
bool cell_bool(const Cell& c);  // 0/1, true/false, yes/no

// Parses a whole string as a finite double; false when it is not one.
bool parse_double(const std::string& s, double* out);

std::string trim(const std::string& s);
std::vector<std::string> split_lines(const std::string& text);
bool is_blank_or_comment(const std::string& line);
// Comma-separated cells; a cell may be "quoted" (with "" for a quote).
std::vector<std::string> split_csv(const std::string& line, const std::string& where);
// Every line of a CSV text that is not blank or a comment, split and its
// cells trimmed: row(cells, where), where being "source:line".
void for_each_csv_row(
    const std::string& text, const std::string& source,
    const std::function<void(std::vector<std::string>& cells, const std::string& where)>& row);
std::vector<std::string> split(const std::string& s, char sep);
// A CSV cell: quoted (quotes doubled) when it holds a comma, quote or line
// break, or always when `always` (what split_csv reads back).
std::string csv_quote(const std::string& v, bool always = false);

// The name in `names` closest to `name` by edit distance, "" when none is close.
std::string closest(const std::string& name, const std::vector<std::string>& names);

// A string fit for a message: bytes outside printable ASCII as \xNN, cut
// after `max_chars` (binary garbage is never echoed raw).
std::string printable(const std::string& s, size_t max_chars = 40);
// gzip's magic bytes at the start of `data`.
bool is_gzip(const std::string& data);
// Inflates gzip (or zlib) data whole; a truncated or corrupt stream is a
// DataError naming the path and the line it reached.
std::string gunzip(const std::string& data, const std::string& path, const char* what);

// Whole file as text; IoError naming `what` and the path when unreadable.
std::string read_text_file(const std::string& path, const char* what);

// A UTF-8 byte-order mark at the start of `text` is removed; true if there was one.
bool strip_bom(std::string& text);

// Runs `read` (a reader of user data); an apiary::Error it throws is thrown
// again, of the same type, with every byte outside printable ASCII escaped
// as \xNN: the last guard that a message never echoes raw bytes.
void with_printable_errors(const std::function<void()>& read);

}  // namespace apiary::sim
