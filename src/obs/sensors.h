#pragma once
// Hardware sensors read from sysfs under a configurable root (so tests can
// drive them from a fake directory): temperatures from class/hwmon and
// class/thermal, CPU clocks from devices/system/cpu/cpuN/cpufreq, and the
// kernel's thermal-throttle counters. A sensor the machine does not have is
// simply absent (no reading, no zero).

#include <cstdint>
#include <string>
#include <vector>

namespace apiary::obs {

struct Temperature {
    std::string sensor;  // "hwmon0/coretemp/Package id 0", "thermal_zone0/x86_pkg_temp"
    double celsius = 0;
};

struct CpuClock {
    int cpu = 0;
    double hz = 0;
    double max_hz = 0;  // 0: unknown
};

struct SensorReadings {
    std::vector<Temperature> temperatures;
    std::vector<CpuClock> clocks;
    int64_t throttle_events = -1;  // sum of the thermal_throttle counters (-1: none exposed)
};

class Sensors {
  public:
    // Finds the sensor files under root once; values are read by read().
    explicit Sensors(std::string root);
    SensorReadings read() const;
    bool empty() const { return temps_.empty() && clocks_.empty() && throttle_.empty(); }
    const std::string& root() const { return root_; }

  private:
    struct TempFile {
        std::string path, sensor;
    };
    struct ClockFiles {
        int cpu;
        std::string cur, max;
    };
    std::string root_;
    std::vector<TempFile> temps_;
    std::vector<ClockFiles> clocks_;
    std::vector<std::string> throttle_;
};

// The first line of a small file, or "" if it cannot be read.
std::string read_line(const std::string& path);

}  // namespace apiary::obs
