#pragma once
// Health of one rank from its sensors: too hot (a temperature above
// health.max_temp_c, cool again below health.resume_temp_c), clocks held
// below health.min_clock_ratio of their maximum, or more kernel
// thermal-throttle events per check than health.max_throttle_events. The
// job acts on the worst rank (the trainer reduces the levels with the
// step's scalars), so every rank throttles or stops at the same step.

#include <cstdint>
#include <string>

#include "obs/keys.h"
#include "obs/sensors.h"

namespace apiary::obs {

class HealthMonitor {
  public:
    HealthMonitor(const HealthOptions& o, int rank);
    // Reads the sensors if health.check_every_s has passed since the last
    // read (now_s: any monotonic clock in seconds). Returns this rank's
    // level: 0 fine, 1 unhealthy. A change sets changed().
    int poll(double now_s);
    int level() const { return level_; }
    bool changed() const { return changed_; }
    // Why the rank is unhealthy (empty when fine).
    const std::string& reason() const { return reason_; }
    int64_t events() const { return events_; }  // times the rank became unhealthy
    const Sensors& sensors() const { return sensors_; }
    const HealthOptions& options() const { return o_; }

  private:
    std::string check(const SensorReadings& r, bool hot_now);
    HealthOptions o_;
    Sensors sensors_;
    double last_check_ = -1e300;
    int64_t last_throttle_ = -1;
    int level_ = 0;
    bool changed_ = false;
    std::string reason_;
    int64_t events_ = 0;
};

}  // namespace apiary::obs
