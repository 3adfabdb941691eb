#include "data/varied_text.h"

#include <array>
#include <string_view>

namespace apiary::data {

namespace {

// splitmix64: a fixed, portable sequence for a given seed.
class Rng {
  public:
    explicit Rng(uint64_t seed) : s_(seed ^ 0x6a09e667f3bcc909ull) {}
    uint64_t next() {
        uint64_t z = (s_ += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    }
    uint32_t below(uint32_t n) { return uint32_t(next() % n); }
    bool percent(uint32_t p) { return below(100) < p; }
    template <class T, size_t N>
    const T& pick(const std::array<T, N>& a) {
        return a[below(uint32_t(N))];
    }

  private:
    uint64_t s_;
};

void put_utf8(uint32_t cp, std::string& out) {
    if (cp < 0x80) {
        out += char(cp);
    } else if (cp < 0x800) {
        out += char(0xC0 | (cp >> 6));
        out += char(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        out += char(0xE0 | (cp >> 12));
        out += char(0x80 | ((cp >> 6) & 0x3F));
        out += char(0x80 | (cp & 0x3F));
    } else {
        out += char(0xF0 | (cp >> 18));
        out += char(0x80 | ((cp >> 12) & 0x3F));
        out += char(0x80 | ((cp >> 6) & 0x3F));
        out += char(0x80 | (cp & 0x3F));
    }
}

constexpr std::array<std::string_view, 40> kOnsets = {
    "",   "",   "",   "b",  "c",  "d",  "f",  "g",  "h",  "j",  "k",  "l",  "m",  "n",
    "p",  "r",  "s",  "t",  "v",  "w",  "z",  "br", "ch", "cl", "dr", "fl", "gr", "kr",
    "pl", "pr", "qu", "sh", "sk", "sl", "sp", "st", "th", "tr", "vr", "str"};
constexpr std::array<std::string_view, 17> kVowels = {
    "a", "e", "i", "o", "u", "a", "e", "i", "o", "y", "ae", "ai", "au", "ea", "ee", "io", "ou"};
constexpr std::array<std::string_view, 16> kCodas = {"",  "",  "",  "",   "n",  "r",  "s",  "l",
                                                     "m", "t", "x", "nd", "rk", "st", "ng", "th"};
// Latin-1 letters for names (é, ö, ñ, ç, ø, å, ü, ß).
constexpr std::array<uint32_t, 8> kAccented = {0xE9, 0xF6, 0xF1, 0xE7, 0xF8, 0xE5, 0xFC, 0xDF};
constexpr std::array<std::string_view, 16> kCommon = {"the", "of",   "and",  "to",   "in", "is",
                                                      "for", "with", "a",    "that", "on", "as",
                                                      "by",  "it",   "from", "or"};
constexpr std::array<std::string_view, 12> kCodeWords = {
    "return", "if", "else", "for", "let", "const", "self", "int", "fn", "def", "new", "auto"};
constexpr std::array<std::string_view, 12> kProsePunct = {",", ",", ".",  ".",  ";", ":",
                                                          "!", "?", " -", " (", ")", "\""};
constexpr std::array<std::string_view, 16> kCodePunct = {"(",    ")",   ", ",  ".",   " = ", " == ",
                                                         " -> ", "::",  ";",   " { ", " }",  "[",
                                                         "]",    " + ", " * ", " && "};

// A script's letters: [lo, hi] code points, all assigned letters in Unicode
// 15 (ICU on Debian 12) and 16 (tiktoken's regex), plus how long its words
// are and whether words are separated by spaces.
struct Script {
    uint32_t lo, hi;
    uint32_t min_len, max_len;
    bool spaces;
};
constexpr std::array<Script, 9> kScripts = {{
    {0x430, 0x44F, 2, 10, true},    // Cyrillic
    {0x3B1, 0x3C9, 2, 10, true},    // Greek
    {0x628, 0x63A, 2, 8, true},     // Arabic
    {0x5D0, 0x5EA, 2, 7, true},     // Hebrew
    {0x915, 0x939, 2, 6, true},     // Devanagari consonants
    {0xE01, 0xE2E, 2, 8, false},    // Thai
    {0xAC00, 0xD7A3, 1, 4, true},   // Hangul syllables
    {0x4E00, 0x9FA5, 1, 4, false},  // CJK ideographs
    {0x30A1, 0x30FA, 2, 6, false},  // Katakana
}};

class Writer {
  public:
    explicit Writer(uint64_t seed) : rng_(seed) {}

    std::string run(size_t bytes) {
        out_.reserve(bytes + 256);
        while (out_.size() < bytes) {
            const uint32_t mode = rng_.below(100);
            if (mode < 40)
                prose_line();
            else if (mode < 65)
                code_line();
            else
                script_line(rng_.pick(kScripts));
            out_ += rng_.percent(15) ? "\n\n" : "\n";
        }
        return std::move(out_);
    }

  private:
    void syllables(uint32_t n) {
        for (uint32_t i = 0; i < n; ++i) {
            out_ += rng_.pick(kOnsets);
            out_ += rng_.pick(kVowels);
            out_ += rng_.pick(kCodas);
        }
    }

    // An invented word; capitalised names sometimes carry an accent.
    void word(bool capital) {
        const size_t at = out_.size();
        syllables(1 + rng_.below(4));
        if (capital && at < out_.size()) {
            out_[at] = char(out_[at] - 32 * (out_[at] >= 'a' && out_[at] <= 'z'));
            if (rng_.percent(20)) put_utf8(rng_.pick(kAccented), out_);
        }
    }

    void number() {
        const uint32_t kind = rng_.below(4);
        if (kind == 0) {
            out_ += "0x";
            for (uint32_t i = 0, n = 2 + rng_.below(7); i < n; ++i)
                out_ += "0123456789abcdef"[rng_.below(16)];
            return;
        }
        for (uint32_t i = 0, n = 1 + rng_.below(6); i < n; ++i) out_ += char('0' + rng_.below(10));
        if (kind == 1) {
            out_ += '.';
            for (uint32_t i = 0, n = 1 + rng_.below(4); i < n; ++i)
                out_ += char('0' + rng_.below(10));
        }
    }

    void prose_line() {
        for (uint32_t w = 0, n = 6 + rng_.below(14); w < n; ++w) {
            if (w > 0) out_ += ' ';
            const uint32_t kind = rng_.below(100);
            if (kind < 12) {
                out_ += rng_.pick(kCommon);
            } else if (kind < 30) {
                word(true);
                if (rng_.percent(10)) out_ += "'s";
            } else if (kind < 36) {
                number();
            } else {
                word(false);
            }
            if (rng_.percent(15)) out_ += rng_.pick(kProsePunct);
        }
    }

    // snake_case, camelCase, PascalCase or SCREAMING_CASE; one in eight is
    // long (a single camelCase pre-token can pass 60 bytes).
    void identifier() {
        const uint32_t style = rng_.below(4);
        const uint32_t parts = rng_.percent(12) ? 6 + rng_.below(8) : 1 + rng_.below(4);
        for (uint32_t p = 0; p < parts; ++p) {
            if (p > 0 && (style == 0 || style == 3)) out_ += '_';
            const size_t first = out_.size();
            syllables(1 + rng_.below(3));
            for (size_t i = first; i < out_.size(); ++i) {
                const bool upper =
                    style == 3 || (i == first && (style == 2 || (style == 1 && p > 0)));
                if (upper) out_[i] = char(out_[i] - 32);
            }
        }
        if (rng_.percent(25)) number();
    }

    void code_line() {
        for (uint32_t i = 0, indent = rng_.below(4); i < indent; ++i) out_ += "    ";
        for (uint32_t t = 0, n = 3 + rng_.below(8); t < n; ++t) {
            const uint32_t kind = rng_.below(100);
            if (kind < 15)
                out_ += rng_.pick(kCodeWords);
            else if (kind < 25)
                number();
            else
                identifier();
            out_ += rng_.pick(kCodePunct);
        }
    }

    void script_line(const Script& s) {
        for (uint32_t w = 0, n = 5 + rng_.below(15); w < n; ++w) {
            if (w > 0 && (s.spaces || rng_.percent(20))) out_ += ' ';
            if (rng_.percent(8)) {
                identifier();  // a Latin name or term inside the line
            } else {
                const uint32_t len = s.min_len + rng_.below(s.max_len - s.min_len + 1);
                for (uint32_t i = 0; i < len; ++i)
                    put_utf8(s.lo + rng_.below(s.hi - s.lo + 1), out_);
            }
            if (rng_.percent(12)) out_ += rng_.pick(kProsePunct);
        }
    }

    Rng rng_;
    std::string out_;
};

}  // namespace

std::string varied_text(uint64_t seed, size_t bytes) { return Writer(seed).run(bytes); }

}  // namespace apiary::data
