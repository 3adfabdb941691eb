#include "core/profile.h"

#include <algorithm>
#include <cstring>

namespace apiary::core {

Profiler& Profiler::get() {
    static Profiler p;
    return p;
}

void Profiler::add(const char* region, double seconds) {
    for (auto& [name, total] : totals_) {
        if (name == region || std::strcmp(name, region) == 0) {
            total += seconds;
            return;
        }
    }
    totals_.emplace_back(region, seconds);
}

std::vector<std::pair<std::string, double>> Profiler::totals() const {
    std::vector<std::pair<std::string, double>> out(totals_.begin(), totals_.end());
    std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
    return out;
}

}  // namespace apiary::core
