#include "obs/health.h"

#include <fmt/format.h>

namespace apiary::obs {

HealthMonitor::HealthMonitor(const HealthOptions& o, int rank)
    : o_(o), sensors_(o.root_for(rank)) {}

// The first reason the rank is unhealthy, or "". While hot, a temperature
// must fall below resume_temp_c to count as cool (hysteresis: a sensor
// hovering at the limit does not flip the job every check).
std::string HealthMonitor::check(const SensorReadings& r, bool hot_now) {
    // Events since the last check, counted whatever else is wrong.
    const int64_t throttled =
        r.throttle_events >= 0 && last_throttle_ >= 0 ? r.throttle_events - last_throttle_ : 0;
    if (r.throttle_events >= 0) last_throttle_ = r.throttle_events;
    const double limit = hot_now ? o_.resume_temp_c : o_.max_temp_c;
    for (const auto& t : r.temperatures) {
        if (t.celsius > limit) {
            return fmt::format(
                "{} at {:.1f} C {} {:.1f} C", t.sensor, t.celsius,
                hot_now ? "is not yet below health.resume_temp_c =" : "exceeds health.max_temp_c =",
                limit);
        }
    }
    if (o_.min_clock_ratio > 0) {
        for (const auto& c : r.clocks) {
            if (c.max_hz > 0 && c.hz < o_.min_clock_ratio * c.max_hz) {
                return fmt::format(
                    "cpu{} clock {:.0f} MHz is below health.min_clock_ratio = {} "
                    "of its maximum {:.0f} MHz",
                    c.cpu, c.hz / 1e6, o_.min_clock_ratio, c.max_hz / 1e6);
            }
        }
    }
    if (o_.max_throttle_events > 0 && throttled > o_.max_throttle_events) {
        return fmt::format(
            "{} thermal-throttle events since the last check (more than "
            "health.max_throttle_events = {})",
            throttled, o_.max_throttle_events);
    }
    return "";
}

int HealthMonitor::poll(double now_s) {
    changed_ = false;
    if (o_.action == HealthAction::none || sensors_.empty()) return level_;
    if (now_s - last_check_ < o_.check_every_s) return level_;
    last_check_ = now_s;
    const std::string why = check(sensors_.read(), level_ > 0);
    const int level = why.empty() ? 0 : 1;
    if (level != level_) {
        changed_ = true;
        if (level > 0) ++events_;
    }
    level_ = level;
    reason_ = why;
    return level_;
}

}  // namespace apiary::obs
