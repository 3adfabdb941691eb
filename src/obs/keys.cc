#include "obs/keys.h"

#include <fmt/format.h>

#include <stdexcept>

#include "core/config.h"
#include "core/error.h"

namespace apiary::obs {

void add_keys(core::Schema& s) {
    s.add_bool("metrics.enabled", true,
               "each rank serves Prometheus metrics at http://metrics.address:(port_base + rank)"
               "/metrics");
    s.add_string("metrics.address", "127.0.0.1",
                 "address the ranks' metrics endpoints bind to (0.0.0.0: every interface, for a "
                 "Prometheus on another host)");
    s.add_int("metrics.port_base", 9400, "rank r serves its metrics on port port_base + r", 1,
              65535);
    s.add_bool("metrics.required", false,
               "stop the run when a metrics port cannot be bound (otherwise: a warning, and "
               "training goes on without that rank's metrics)");
    s.add_real("metrics.linger_s", 0.0,
               "seconds to keep serving /metrics after the run ends, so that a last scrape sees "
               "the final values",
               0.0, 86400.0);
    s.add_string("metrics.sd_file", "",
                 "Prometheus file-based service discovery targets that `apiary launch` writes "
                 "for its ranks (empty: prometheus/<name>.json beside the run directory, e.g. "
                 "runs/prometheus/x.json for runs/x)");

    s.add_string("health.action", "warn",
                 "what a rank too hot or clock-throttled does: 'none', 'warn' (an event in the "
                 "logs and metrics), 'throttle' (every rank slows down until it cools) or "
                 "'checkpoint' (save and exit 75 for the scheduler to move the job)",
                 {"none", "warn", "throttle", "checkpoint"});
    s.add_string("health.sysfs_root", "/sys",
                 "where the sensors are read (class/hwmon, class/thermal, devices/system/cpu); "
                 "'{rank}' is replaced by the rank");
    s.add_real("health.max_temp_c", 95.0, "a temperature sensor above this raises an event", 0.0,
               1000.0);
    s.add_real("health.resume_temp_c", 85.0,
               "after an event, the rank counts as cool again once every sensor is below this", 0.0,
               1000.0);
    s.add_real("health.min_clock_ratio", 0.0,
               "a CPU clock below this fraction of its maximum raises an event (0: off)", 0.0, 1.0);
    s.add_int("health.max_throttle_events", 0,
              "kernel thermal-throttle events (thermal_throttle/*_throttle_count) per check above "
              "which an event is raised (0: off)",
              0, 1e12);
    s.add_real("health.check_every_s", 5.0, "seconds between sensor checks", 0.0, 86400.0);
    s.add_real("health.pause_s", 0.5, "throttle: pause between steps while any rank is hot", 0.0,
               3600.0);
    s.add_int("health.throttle_threads", 0,
              "throttle: compute threads while any rank is hot (0: half of train.threads)", 0,
              4096);

    s.add_string("profile.steps", "",
                 "steps traced, e.g. '10-12' or '7': each rank writes trace/rank_NNNNN.json "
                 "(Chrome trace format, for Perfetto); empty: none");
}

MetricsOptions MetricsOptions::from_config(const core::Config& c) {
    MetricsOptions o;
    o.enabled = c.get_bool("metrics.enabled");
    o.address = c.get_string("metrics.address");
    o.port_base = int(c.get_int("metrics.port_base"));
    o.required = c.get_bool("metrics.required");
    o.linger_s = c.get_real("metrics.linger_s");
    o.sd_file = c.get_string("metrics.sd_file");
    return o;
}

HealthOptions HealthOptions::from_config(const core::Config& c) {
    HealthOptions o;
    const std::string& a = c.get_string("health.action");
    o.action = a == "none"         ? HealthAction::none
               : a == "throttle"   ? HealthAction::throttle
               : a == "checkpoint" ? HealthAction::checkpoint
                                   : HealthAction::warn;
    o.sysfs_root = c.get_string("health.sysfs_root");
    o.max_temp_c = c.get_real("health.max_temp_c");
    o.resume_temp_c = c.get_real("health.resume_temp_c");
    if (o.resume_temp_c > o.max_temp_c) {
        throw ConfigError(fmt::format(
            "health.resume_temp_c = {} exceeds health.max_temp_c = {}: a rank must cool below "
            "the limit before it counts as cool again",
            o.resume_temp_c, o.max_temp_c));
    }
    o.min_clock_ratio = c.get_real("health.min_clock_ratio");
    o.max_throttle_events = c.get_int("health.max_throttle_events");
    o.check_every_s = c.get_real("health.check_every_s");
    o.pause_s = c.get_real("health.pause_s");
    o.throttle_threads = int(c.get_int("health.throttle_threads"));
    return o;
}

std::string HealthOptions::root_for(int rank) const {
    std::string out = sysfs_root;
    for (size_t at; (at = out.find("{rank}")) != std::string::npos;) {
        out.replace(at, 6, std::to_string(rank));
    }
    return out;
}

ProfileOptions parse_step_range(const std::string& text, const std::string& key) {
    ProfileOptions o;
    if (text.empty()) return o;
    auto number = [&](const std::string& part) {
        size_t used = 0;
        int64_t v = 0;
        try {
            v = std::stoll(part, &used);
        } catch (const std::exception&) {
            used = 0;
        }
        if (used != part.size() || v < 1) {
            throw ConfigError(fmt::format(
                "{} = '{}': '{}' is not a step number; give a step or a range of 1-based steps, "
                "e.g. '10-12'",
                key, text, part));
        }
        return v;
    };
    const size_t dash = text.find('-');
    o.first = number(text.substr(0, dash));
    o.last = dash == std::string::npos ? o.first : number(text.substr(dash + 1));
    if (o.last < o.first) {
        throw ConfigError(fmt::format("{} = '{}': the range ends before it starts", key, text));
    }
    return o;
}

ProfileOptions ProfileOptions::from_config(const core::Config& c) {
    return parse_step_range(c.get_string("profile.steps"), "profile.steps");
}

}  // namespace apiary::obs
