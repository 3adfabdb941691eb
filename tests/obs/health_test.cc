// Sensors read from a fake sysfs tree, and the health decision on them.

#include "obs/health.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "obs/keys.h"
#include "obs/sensors.h"
#include "obs_test_util.h"

namespace apiary::obs {
namespace {

using testing::TempDir;
using testing::write_file;

void fake_sensors(const TempDir& d, double temp_c, int mhz = 2000, int throttle = 0) {
    write_file(d / "class/hwmon/hwmon0/name", "coretemp\n");
    write_file(d / "class/hwmon/hwmon0/temp1_label", "Package id 0\n");
    write_file(d / "class/hwmon/hwmon0/temp1_input", std::to_string(int(temp_c * 1000)) + "\n");
    write_file(d / "class/hwmon/hwmon0/temp2_input", "40000\n");  // no label: named temp2
    write_file(d / "class/thermal/thermal_zone0/type", "x86_pkg_temp\n");
    write_file(d / "class/thermal/thermal_zone0/temp", "41500\n");
    write_file(d / "devices/system/cpu/cpu0/cpufreq/scaling_cur_freq",
               std::to_string(mhz * 1000) + "\n");
    write_file(d / "devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq", "3000000\n");
    write_file(d / "devices/system/cpu/cpu0/thermal_throttle/core_throttle_count",
               std::to_string(throttle) + "\n");
}

TEST(Sensors, ReadsTemperaturesClocksAndThrottleCounts) {
    TempDir d;
    fake_sensors(d, 55.5, 1500, 7);
    const Sensors s(d.path());
    ASSERT_FALSE(s.empty());
    const SensorReadings r = s.read();
    ASSERT_EQ(r.temperatures.size(), 3u);
    EXPECT_EQ(r.temperatures[0].sensor, "hwmon0/coretemp/Package id 0");
    EXPECT_DOUBLE_EQ(r.temperatures[0].celsius, 55.5);
    EXPECT_EQ(r.temperatures[1].sensor, "hwmon0/coretemp/temp2");
    EXPECT_EQ(r.temperatures[2].sensor, "thermal_zone0/x86_pkg_temp");
    EXPECT_DOUBLE_EQ(r.temperatures[2].celsius, 41.5);
    ASSERT_EQ(r.clocks.size(), 1u);
    EXPECT_DOUBLE_EQ(r.clocks[0].hz, 1.5e9);
    EXPECT_DOUBLE_EQ(r.clocks[0].max_hz, 3e9);
    EXPECT_EQ(r.throttle_events, 7);
}

TEST(Sensors, AbsentSensorsGiveNoReadings) {
    TempDir d;
    const Sensors s(d.path());
    EXPECT_TRUE(s.empty());
    const SensorReadings r = s.read();
    EXPECT_TRUE(r.temperatures.empty());
    EXPECT_TRUE(r.clocks.empty());
    EXPECT_EQ(r.throttle_events, -1);
}

HealthOptions options(const TempDir& d) {
    HealthOptions o;
    o.sysfs_root = d.path();
    o.max_temp_c = 90;
    o.resume_temp_c = 80;
    o.check_every_s = 0;
    return o;
}

TEST(Health, HotAboveTheLimitAndCoolOnlyBelowTheResumeTemperature) {
    TempDir d;
    fake_sensors(d, 60);
    HealthMonitor h(options(d), 0);
    EXPECT_EQ(h.poll(1), 0);
    EXPECT_FALSE(h.changed());
    fake_sensors(d, 95);
    EXPECT_EQ(h.poll(2), 1);
    EXPECT_TRUE(h.changed());
    EXPECT_NE(h.reason().find("hwmon0/coretemp/Package id 0 at 95.0 C exceeds health.max_temp_c"),
              std::string::npos)
        << h.reason();
    EXPECT_EQ(h.events(), 1);
    fake_sensors(d, 85);  // below the limit, not yet below the resume temperature
    EXPECT_EQ(h.poll(3), 1);
    EXPECT_FALSE(h.changed());
    fake_sensors(d, 75);
    EXPECT_EQ(h.poll(4), 0);
    EXPECT_TRUE(h.changed());
    EXPECT_EQ(h.reason(), "");
}

TEST(Health, ChecksOnlyEveryInterval) {
    TempDir d;
    fake_sensors(d, 60);
    HealthOptions o = options(d);
    o.check_every_s = 10;
    HealthMonitor h(o, 0);
    EXPECT_EQ(h.poll(100), 0);
    fake_sensors(d, 99);
    EXPECT_EQ(h.poll(105), 0);  // not due yet
    EXPECT_EQ(h.poll(110), 1);
}

TEST(Health, LowClockAndThrottleEvents) {
    TempDir d;
    fake_sensors(d, 60, 2900, 100);
    HealthOptions o = options(d);
    o.min_clock_ratio = 0.8;
    o.max_throttle_events = 5;
    HealthMonitor h(o, 0);
    EXPECT_EQ(h.poll(1), 0);
    fake_sensors(d, 60, 2900, 110);  // 10 events since the last check
    EXPECT_EQ(h.poll(2), 1);
    EXPECT_NE(h.reason().find("10 thermal-throttle events"), std::string::npos) << h.reason();
    fake_sensors(d, 60, 1000, 110);
    EXPECT_EQ(h.poll(3), 1);
    EXPECT_NE(h.reason().find("cpu0 clock 1000 MHz is below health.min_clock_ratio"),
              std::string::npos)
        << h.reason();
    fake_sensors(d, 60, 2900, 110);
    EXPECT_EQ(h.poll(4), 0);
}

TEST(Health, ActionNoneNeverReads) {
    TempDir d;
    fake_sensors(d, 99);
    HealthOptions o = options(d);
    o.action = HealthAction::none;
    HealthMonitor h(o, 0);
    EXPECT_EQ(h.poll(1), 0);
}

TEST(Health, RootPerRank) {
    HealthOptions o;
    o.sysfs_root = "/fake/{rank}/sys";
    EXPECT_EQ(o.root_for(3), "/fake/3/sys");
}

TEST(Keys, StepRanges) {
    const ProfileOptions a = parse_step_range("10-12", "profile.steps");
    EXPECT_EQ(a.first, 10);
    EXPECT_EQ(a.last, 12);
    EXPECT_TRUE(a.covers(11));
    EXPECT_FALSE(a.covers(13));
    const ProfileOptions b = parse_step_range("7", "profile.steps");
    EXPECT_EQ(b.first, 7);
    EXPECT_EQ(b.last, 7);
    EXPECT_FALSE(parse_step_range("", "profile.steps").any());
    for (const char* bad : {"0-3", "a-b", "12-10", "5-", "-4", "3x"}) {
        try {
            parse_step_range(bad, "profile.steps");
            ADD_FAILURE() << bad << " was accepted";
        } catch (const ConfigError& e) {
            EXPECT_NE(std::string(e.what()).find("profile.steps = '"), std::string::npos)
                << e.what();
        }
    }
}

}  // namespace
}  // namespace apiary::obs
