#pragma once
// GPT-2 pre-tokenization: splits text into the pieces BPE merges never cross,
// exactly as the regex
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// of GPT-2 / tiktoken's `gpt2` / Hugging Face's ByteLevel pre-tokenizer.
//
// Hand-written rather than a regex engine: std::regex has no \p{L}, and a
// single forward scan over a code-point category table is several times faster
// than a backtracking engine on this pattern (the `\s+(?!\S)` look-ahead only
// ever needs one code point). Categories come from ICU (Unicode 15 in Debian
// 12's ICU 72, the version the Rust regex crate under tiktoken uses).
//
// Bytes that are not valid UTF-8 are each treated as one code point of
// category "other", so every byte string splits and round-trips.

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace apiary::data {

enum class CharClass : uint8_t { other = 0, letter = 1, number = 2, space = 3 };

// Decodes one code point at s[i]; returns its byte length (1 for an invalid
// byte, which then has class `other`) and stores its class.
size_t next_char(std::string_view s, size_t i, CharClass* cls, uint32_t* cp = nullptr);

// Length in bytes of the pre-token that starts at s[i] (i < s.size()).
size_t pretoken_length(std::string_view s, size_t i);

// Calls fn(std::string_view piece) for every pre-token of s, in order.
template <class Fn>
void for_each_pretoken(std::string_view s, Fn&& fn) {
    size_t i = 0;
    while (i < s.size()) {
        const size_t n = pretoken_length(s, i);
        fn(s.substr(i, n));
        i += n;
    }
}

// A byte offset in [from, s.size()] where a pre-token is known to start no
// matter where scanning began: after an ASCII letter and before a space. Scans
// forward from `from`; returns s.size() if there is none. Lets big inputs be
// encoded in parallel chunks with the same result as one sequential scan.
size_t safe_split_point(std::string_view s, size_t from);

}  // namespace apiary::data
