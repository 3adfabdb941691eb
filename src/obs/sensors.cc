#include "obs/sensors.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>

namespace apiary::obs {

namespace fs = std::filesystem;

namespace {

std::optional<double> read_number(const std::string& path) {
    const std::string s = read_line(path);
    if (s.empty()) return std::nullopt;
    char* end = nullptr;
    const double v = std::strtod(s.c_str(), &end);
    if (end == s.c_str()) return std::nullopt;
    return v;
}

// Entries of dir whose names match re, sorted (hwmon10 after hwmon9).
std::vector<fs::path> entries(const fs::path& dir, const std::regex& re) {
    std::vector<fs::path> out;
    std::error_code ec;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
        if (std::regex_match(it->path().filename().string(), re)) out.push_back(it->path());
    }
    std::sort(out.begin(), out.end(), [](const fs::path& a, const fs::path& b) {
        const std::string x = a.filename().string(), y = b.filename().string();
        return x.size() != y.size() ? x.size() < y.size() : x < y;
    });
    return out;
}

}  // namespace

std::string read_line(const std::string& path) {
    std::ifstream in(path);
    std::string line;
    if (!in || !std::getline(in, line)) return "";
    while (!line.empty() && (line.back() == '\n' || line.back() == ' ')) line.pop_back();
    return line;
}

Sensors::Sensors(std::string root) : root_(std::move(root)) {
    const fs::path r(root_);
    for (const auto& hw : entries(r / "class/hwmon", std::regex("hwmon[0-9]+"))) {
        const std::string chip = read_line((hw / "name").string());
        for (const auto& t : entries(hw, std::regex("temp[0-9]+_input"))) {
            const std::string base =
                t.filename().string().substr(0, t.filename().string().find('_'));
            std::string label = read_line((hw / (base + "_label")).string());
            if (label.empty()) label = base;
            temps_.push_back({t.string(), hw.filename().string() + "/" +
                                              (chip.empty() ? "?" : chip) + "/" + label});
        }
    }
    for (const auto& z : entries(r / "class/thermal", std::regex("thermal_zone[0-9]+"))) {
        if (!fs::exists(z / "temp")) continue;
        const std::string type = read_line((z / "type").string());
        temps_.push_back(
            {(z / "temp").string(), z.filename().string() + "/" + (type.empty() ? "?" : type)});
    }
    for (const auto& c : entries(r / "devices/system/cpu", std::regex("cpu[0-9]+"))) {
        const int cpu = std::atoi(c.filename().string().c_str() + 3);
        const fs::path f = c / "cpufreq";
        if (fs::exists(f / "scaling_cur_freq")) {
            clocks_.push_back(
                {cpu, (f / "scaling_cur_freq").string(), (f / "cpuinfo_max_freq").string()});
        }
        for (const char* n : {"core_throttle_count", "package_throttle_count"}) {
            if (fs::exists(c / "thermal_throttle" / n)) {
                throttle_.push_back((c / "thermal_throttle" / n).string());
            }
        }
    }
}

SensorReadings Sensors::read() const {
    SensorReadings out;
    for (const auto& t : temps_) {
        // sysfs temperatures are in millidegrees Celsius.
        if (auto v = read_number(t.path)) out.temperatures.push_back({t.sensor, *v / 1000.0});
    }
    for (const auto& c : clocks_) {
        // cpufreq reports kHz.
        const auto cur = read_number(c.cur);
        if (!cur) continue;
        const auto max = read_number(c.max);
        out.clocks.push_back({c.cpu, *cur * 1e3, max ? *max * 1e3 : 0.0});
    }
    for (const auto& p : throttle_) {
        if (auto v = read_number(p))
            out.throttle_events = std::max<int64_t>(0, out.throttle_events) + int64_t(*v);
    }
    return out;
}

}  // namespace apiary::obs
