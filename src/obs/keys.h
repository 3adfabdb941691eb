#pragma once
// Config keys of observability (metrics.*, health.*, profile.*) and the
// typed options read from them; `apiary config keys` lists them.

#include <cstdint>
#include <string>

namespace apiary::core {
class Config;
class Schema;
}  // namespace apiary::core

namespace apiary::obs {

void add_keys(core::Schema& schema);

struct MetricsOptions {
    bool enabled = true;
    std::string address = "127.0.0.1";
    int port_base = 9400;   // rank r serves on port_base + r
    bool required = false;  // a port that cannot be bound stops the run
    double linger_s = 0;    // keep serving this long after the run ends
    std::string sd_file;    // file-SD targets `apiary launch` writes ("": beside run.dir)
    static MetricsOptions from_config(const core::Config& c);
    int port(int rank) const { return port_base + rank; }
};

enum class HealthAction { none, warn, throttle, checkpoint };

struct HealthOptions {
    HealthAction action = HealthAction::warn;
    std::string sysfs_root = "/sys";  // "{rank}" is replaced by the rank
    double max_temp_c = 95;           // a sensor above this is too hot
    double resume_temp_c = 85;        // ... and below this again, cool
    double min_clock_ratio = 0;       // a CPU clock below this fraction of its maximum (0: off)
    int64_t max_throttle_events = 0;  // kernel thermal-throttle events per check (0: off)
    double check_every_s = 5;
    double pause_s = 0.5;      // throttle: pause between steps
    int throttle_threads = 0;  // throttle: compute threads (0: half)
    static HealthOptions from_config(const core::Config& c);
    std::string root_for(int rank) const;
};

// [profile] steps = "10-12": the 1-based steps traced (first = 0: none).
struct ProfileOptions {
    int64_t first = 0, last = 0;
    static ProfileOptions from_config(const core::Config& c);
    bool any() const { return first > 0; }
    bool covers(int64_t step) const { return step >= first && step <= last; }
};

// "10-12", "7" or "" (none); throws ConfigError naming the key otherwise.
ProfileOptions parse_step_range(const std::string& text, const std::string& key);

}  // namespace apiary::obs
