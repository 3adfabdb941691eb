#include "core/error.h"

#include <cstring>

namespace apiary::detail {

void check_failed(const char* file, int line, const char* cond, const std::string& message) {
    // Keep only the path from src/ on, so messages carry no machine paths.
    const char* rel = std::strstr(file, "src/");
    throw Error(fmt::format("{} (check `{}` failed at {}:{})", message, cond, rel ? rel : file,
                            line));
}

}  // namespace apiary::detail
