#include "obs/sd.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"

namespace apiary::obs {

namespace fs = std::filesystem;

void write_sd_targets(const std::string& path, const std::string& run,
                      const std::vector<ScrapeTarget>& targets) {
    nlohmann::json groups = nlohmann::json::array();
    for (const auto& t : targets) {
        groups.push_back({{"targets", {fmt::format("{}:{}", t.host, t.port)}},
                          {"labels",
                           {{"apiary_run", run},
                            {"apiary_rank", std::to_string(t.rank)},
                            {"apiary_host", t.host}}}});
    }
    const fs::path p(path);
    std::error_code ec;
    if (p.has_parent_path()) fs::create_directories(p.parent_path(), ec);
    const std::string tmp = path + ".tmp";
    {
        std::ofstream out(tmp, std::ios::trunc);
        out << groups.dump(2) << "\n";
        out.flush();
        if (!out) {
            throw IoError(
                fmt::format("{}: cannot write the Prometheus scrape targets (set "
                            "metrics.sd_file to a writable path)",
                            tmp));
        }
    }
    fs::rename(tmp, path, ec);
    if (ec) throw IoError(fmt::format("{}: cannot rename to {}: {}", tmp, path, ec.message()));
}

std::vector<ScrapeTarget> place_targets(int ranks, const std::string& hosts,
                                        const std::string& address, int port_base) {
    const bool any = address == "0.0.0.0" || address == "::";
    std::vector<std::pair<std::string, int>> slots;
    std::stringstream ss(hosts);
    for (std::string item; std::getline(ss, item, ',');) {
        if (item.empty()) continue;
        const size_t colon = item.rfind(':');
        int n = 1;
        if (colon != std::string::npos) {
            try {
                n = std::stoi(item.substr(colon + 1));
            } catch (const std::exception&) {
                throw ConfigError(fmt::format("--hosts '{}': '{}' is not host:slots", hosts, item));
            }
        }
        slots.push_back({item.substr(0, colon), std::max(1, n)});
    }
    std::vector<ScrapeTarget> out;
    size_t host = 0;
    int used = 0;
    // A rank's port counts from port_base by its rank, whatever its host.
    for (int r = 0; r < ranks; ++r) {
        std::string h = any ? "127.0.0.1" : address;
        if (!slots.empty()) {
            if (used == slots[host].second) {
                host = (host + 1) % slots.size();  // mpirun wraps round when oversubscribed
                used = 0;
            }
            h = slots[host].first;
            ++used;
        }
        out.push_back({h, port_base + r, r});
    }
    return out;
}

}  // namespace apiary::obs
