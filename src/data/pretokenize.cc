#include "data/pretokenize.h"

#include <unicode/uchar.h>

#include <memory>
#include <mutex>

namespace apiary::data {

namespace {

// One byte per code point (1.1 MB), filled once from ICU: a lookup is then a
// single load, where ICU's own trie costs a few branches per call.
const uint8_t* class_table() {
    static std::unique_ptr<uint8_t[]> table;
    static std::once_flag once;
    std::call_once(once, [] {
        table.reset(new uint8_t[0x110000]);
        for (UChar32 c = 0; c < 0x110000; ++c) {
            CharClass k = CharClass::other;
            if (u_isUWhiteSpace(c)) {
                k = CharClass::space;
            } else {
                const int8_t t = u_charType(c);
                if (t == U_UPPERCASE_LETTER || t == U_LOWERCASE_LETTER || t == U_TITLECASE_LETTER ||
                    t == U_MODIFIER_LETTER || t == U_OTHER_LETTER) {
                    k = CharClass::letter;
                } else if (t == U_DECIMAL_DIGIT_NUMBER || t == U_LETTER_NUMBER ||
                           t == U_OTHER_NUMBER) {
                    k = CharClass::number;
                }
            }
            table[c] = static_cast<uint8_t>(k);
        }
    });
    return table.get();
}

const uint8_t* const kTable = class_table();

inline bool cont(unsigned char b) { return (b & 0xC0) == 0x80; }

}  // namespace

size_t next_char(std::string_view s, size_t i, CharClass* cls, uint32_t* cp_out) {
    const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + i;
    const size_t left = s.size() - i;
    const unsigned char b0 = p[0];
    uint32_t cp;
    size_t n;
    if (b0 < 0x80) {
        cp = b0;
        n = 1;
    } else if (b0 >= 0xC2 && b0 < 0xE0 && left >= 2 && cont(p[1])) {
        cp = ((b0 & 0x1Fu) << 6) | (p[1] & 0x3Fu);
        n = 2;
    } else if (b0 >= 0xE0 && b0 < 0xF0 && left >= 3 && cont(p[1]) && cont(p[2])) {
        cp = ((b0 & 0x0Fu) << 12) | ((p[1] & 0x3Fu) << 6) | (p[2] & 0x3Fu);
        n = 3;
        // Overlong forms and UTF-16 surrogates are not valid UTF-8.
        if (cp < 0x800 || (cp >= 0xD800 && cp < 0xE000)) n = 0;
    } else if (b0 >= 0xF0 && b0 < 0xF5 && left >= 4 && cont(p[1]) && cont(p[2]) && cont(p[3])) {
        cp = ((b0 & 0x07u) << 18) | ((p[1] & 0x3Fu) << 12) | ((p[2] & 0x3Fu) << 6) | (p[3] & 0x3Fu);
        n = 4;
        if (cp < 0x10000 || cp > 0x10FFFF) n = 0;
    } else {
        n = 0;
    }
    if (n == 0) {
        *cls = CharClass::other;
        if (cp_out) *cp_out = 0xFFFFFFFFu;
        return 1;
    }
    *cls = static_cast<CharClass>(kTable[cp]);
    if (cp_out) *cp_out = cp;
    return n;
}

size_t pretoken_length(std::string_view s, size_t i) {
    const size_t start = i;
    CharClass c;
    const size_t n0 = next_char(s, i, &c);
    const char b0 = s[i];

    // 's 't 're 've 'm 'll 'd (case-sensitive, as in GPT-2).
    if (b0 == '\'' && i + 1 < s.size()) {
        const char a = s[i + 1];
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
        if (i + 2 < s.size()) {
            const char b = s[i + 2];
            if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) {
                return 3;
            }
        }
    }

    // ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`: an optional ASCII space
    // then a run of one class.
    size_t j = i;
    CharClass run = c;
    size_t step = n0;
    if (b0 == ' ' && i + 1 < s.size()) {
        CharClass c1;
        const size_t n1 = next_char(s, i + 1, &c1);
        if (c1 != CharClass::space) {
            j = i + 1;
            run = c1;
            step = n1;
        }
    }
    if (run != CharClass::space) {
        j += step;
        while (j < s.size()) {
            CharClass k;
            const size_t n = next_char(s, j, &k);
            if (k != run) break;
            j += n;
        }
        return j - start;
    }

    // Whitespace: `\s+(?!\S)` takes the whole run at the end of input, else
    // all but its last code point (which then prefixes the next piece);
    // a single whitespace before non-space falls through to `\s+`.
    size_t last = i;  // start of the last whitespace code point in the run
    j = i;
    while (j < s.size()) {
        CharClass k;
        const size_t n = next_char(s, j, &k);
        if (k != CharClass::space) break;
        last = j;
        j += n;
    }
    if (j == s.size() || last == i) return j - start;
    return last - start;
}

size_t safe_split_point(std::string_view s, size_t from) {
    for (size_t p = from == 0 ? 1 : from; p < s.size(); ++p) {
        const unsigned char prev = static_cast<unsigned char>(s[p - 1]);
        const bool letter = (prev | 0x20) >= 'a' && (prev | 0x20) <= 'z';
        if (letter && s[p] == ' ') return p;
    }
    return s.size();
}

}  // namespace apiary::data
