#pragma once
// Errors: exceptions at boundaries, checks inside (STYLE.md). Only cli/
// catches; it prints the one-line message and exits non-zero.

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace apiary {

class Error : public std::runtime_error {
  public:
    explicit Error(const std::string& what) : std::runtime_error(what) {}
};
// A config key, value or layout that cannot be used.
class ConfigError : public Error {
    using Error::Error;
};
// Input data (corpus, shards, tokenizer) that is missing or malformed.
class DataError : public Error {
    using Error::Error;
};
// A file that cannot be read or written, or a checkpoint that is not ours.
class IoError : public Error {
    using Error::Error;
};
// A collective that failed, timed out or did not match across ranks.
class CommError : public Error {
    using Error::Error;
};
// A device (CPU feature, GPU) that is missing or failed.
class DeviceError : public Error {
    using Error::Error;
};

// An allocation that the machine cannot satisfy.
class OutOfMemoryError : public Error {
    using Error::Error;
};

namespace detail {
[[noreturn]] void check_failed(const char* file, int line, const char* cond,
                               const std::string& message);
}  // namespace detail

}  // namespace apiary

// APIARY_CHECK(cond, fmt, args...) throws apiary::Error naming file:line, the
// condition and a formatted message with the offending values.
#define APIARY_CHECK(cond, ...)                                                                    \
    do {                                                                                           \
        if (!(cond)) [[unlikely]] {                                                                \
            ::apiary::detail::check_failed(__FILE__, __LINE__, #cond, ::fmt::format(__VA_ARGS__)); \
        }                                                                                          \
    } while (0)
