// Run reports from metrics.jsonl, the Prometheus endpoint over HTTP, and
// the file-SD targets of a launch.

#include "obs/report.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "obs/metrics.h"
#include "obs/observer.h"
#include "obs/sd.h"
#include "obs/sensors.h"
#include "obs_test_util.h"

namespace apiary::obs {
namespace {

using testing::TempDir;
using testing::write_file;

std::string record(int step, double loss, double tps, double mfu) {
    return nlohmann::json{{"step", step},   {"loss", loss},       {"tokens_per_s", tps},
                          {"mfu", mfu},     {"step_time_s", 0.1}, {"elapsed_s", step * 0.1},
                          {"world_size", 2}}
               .dump() +
           "\n";
}

std::string run_dir(const TempDir& d, const std::string& name, double scale) {
    std::string text;
    for (int s = 10; s <= 50; s += 10) text += record(s, 5.0 - s * 0.05 * scale, 1000 * scale, 0.3);
    text += nlohmann::json{{"step", 50}, {"eval_loss", 2.5}}.dump() + "\n";
    write_file(d / (name + "/metrics.jsonl"), text);
    return d / name;
}

TEST(Report, ReadsStepAndEvalRecords) {
    TempDir d;
    const RunSeries r = read_run(run_dir(d, "a", 1.0));
    EXPECT_EQ(r.name, "a");
    ASSERT_EQ(r.step.size(), 5u);
    EXPECT_DOUBLE_EQ(r.step.back(), 50);
    EXPECT_DOUBLE_EQ(r.loss.back(), 2.5);
    EXPECT_EQ(r.world_size, 2);
    ASSERT_EQ(r.eval_loss.size(), 1u);
    const std::string s = format_summary({r});
    EXPECT_NE(s.find("best eval loss"), std::string::npos) << s;
    EXPECT_NE(s.find("2.5000"), std::string::npos) << s;
}

TEST(Report, BadRunDirectoriesAreNamed) {
    TempDir d;
    EXPECT_THROW(read_run(d / "nope"), IoError);
    std::filesystem::create_directories(d / "empty");
    try {
        read_run(d / "empty");
        FAIL();
    } catch (const IoError& e) {
        EXPECT_NE(std::string(e.what()).find("metrics.jsonl: missing"), std::string::npos);
    }
    write_file(d / "bad/metrics.jsonl", record(1, 3, 1, 0.1) + "{oops\n" + record(2, 3, 1, 0.1));
    try {
        read_run(d / "bad");
        FAIL();
    } catch (const DataError& e) {
        EXPECT_NE(std::string(e.what()).find("metrics.jsonl:2:"), std::string::npos) << e.what();
    }
    write_file(d / "noloss/metrics.jsonl", "{\"step\": 3, \"eval_loss\": 2}\n");
    EXPECT_THROW(read_run(d / "noloss"), DataError);
}

TEST(Report, TornLastRecordIsSkippedWithANote) {
    TempDir d;
    write_file(d / "torn/metrics.jsonl", record(1, 3, 1, 0.1) + "{\"step\": 2, \"lo");
    const RunSeries r = read_run(d / "torn");
    EXPECT_EQ(r.step.size(), 1u);
    ASSERT_EQ(r.notes.size(), 1u);
    EXPECT_NE(format_summary({r}).find("torn last record"), std::string::npos);
}

TEST(Report, PlotsDrawEveryRun) {
    TempDir d;
    const std::vector<RunSeries> runs = {read_run(run_dir(d, "a", 1.0)),
                                         read_run(run_dir(d, "b", 2.0))};
    const std::string p = plot_terminal(runs, Metric::loss, 40, 10, false);
    EXPECT_NE(p.find('*'), std::string::npos) << p;
    EXPECT_NE(p.find('+'), std::string::npos) << p;
    EXPECT_NE(p.find("* a   + b"), std::string::npos) << p;
    // Run a falls from 4.5 to 2.5, run b from 4.0 to 0.0: b ends on the bottom line.
    const auto bottom = p.find("0 |");
    ASSERT_NE(bottom, std::string::npos) << p;
    EXPECT_EQ(p.substr(bottom, 64).find('+') != std::string::npos, true) << p;
    const std::string html = report_html(runs);
    EXPECT_EQ(html.find("<script"), std::string::npos);
    size_t lines = 0;
    for (size_t at = 0; (at = html.find("<polyline", at)) != std::string::npos; ++at) ++lines;
    EXPECT_EQ(lines, 8u);  // two runs in three charts, and their held-out loss
    EXPECT_NE(html.find("<td>2.5000</td>"), std::string::npos);
}

TEST(Report, HtmlPlotsTheHeldOutLossTheTableReports) {
    TempDir d;
    std::string text;
    for (int s = 10; s <= 40; s += 10) text += record(s, 5.0 - s * 0.05, 1000, 0.3);
    // Held-out losses above every training loss: they must widen the axis.
    text += nlohmann::json{{"step", 20}, {"eval_loss", 7.0}}.dump() + "\n";
    text += nlohmann::json{{"step", 40}, {"eval_loss", 6.0}}.dump() + "\n";
    write_file(d / "e/metrics.jsonl", text);
    const std::string html = report_html({read_run(d / "e")});
    const auto at = html.find("<polyline class='series eval'");
    ASSERT_NE(at, std::string::npos) << html;
    const auto end = html.find("/>", at);
    const std::string line = html.substr(at, end - at);
    // Two points, the second (6.0) below the first (7.0) on the page.
    const auto pts_at = line.find("points='") + 8;
    std::stringstream pts(line.substr(pts_at, line.find('\'', pts_at) - pts_at));
    double x1, y1, x2, y2;
    char comma;
    ASSERT_TRUE(pts >> x1 >> comma >> y1 >> x2 >> comma >> y2) << line;
    EXPECT_LT(x1, x2);
    EXPECT_GT(y2, y1);
    EXPECT_GE(y1, 34.0) << "the held-out loss is drawn above the plot area";
    size_t dots = 0;
    for (size_t i = 0; (i = html.find("<circle class='eval'", i)) != std::string::npos; ++i) ++dots;
    EXPECT_EQ(dots, 2u);
}

TEST(Report, NiceTicks) {
    EXPECT_EQ(nice_ticks(0, 1, 5), (std::vector<double>{0, 0.2, 0.4, 0.6000000000000001, 0.8, 1}));
    const auto t = nice_ticks(1234, 98765, 5);
    EXPECT_EQ(t.front(), 20000);
    EXPECT_EQ(tick_label(20000), "20k");
    EXPECT_EQ(tick_label(2.5e6), "2.5M");
}

int free_port() {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    socklen_t n = sizeof(a);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n);
    ::close(fd);
    return ntohs(a.sin_port);
}

// Connected to 127.0.0.1:port; -1 if not.
int connect_local(int port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(uint16_t(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
        ::close(fd);
        return -1;
    }
    return fd;
}

std::string http_get(int port, const std::string& path) {
    const int fd = connect_local(port);
    if (fd < 0) return "";
    const std::string req = "GET " + path + " HTTP/1.0\r\nHost: localhost\r\n\r\n";
    (void)!::write(fd, req.data(), req.size());
    std::string out;
    char buf[4096];
    for (ssize_t n; (n = ::read(fd, buf, sizeof(buf))) > 0;) out.append(buf, size_t(n));
    ::close(fd);
    return out;
}

TEST(Metrics, ServesTheStepAndSensorsOverHttp) {
    TempDir d;
    write_file(d / "class/hwmon/hwmon0/name", "coretemp\n");
    write_file(d / "class/hwmon/hwmon0/temp1_input", "61000\n");
    const Sensors sensors(d.path());
    const int port = free_port();
    MetricsServer m("127.0.0.1", port, 3, "myrun", &sensors);
    StepValues v;
    v.step = 42;
    v.loss = 2.5;
    v.tokens_per_s = 1234;
    v.busy_s = 3;  // this step's; the ratio is of the one the extremes are over
    v.busy_sent_s = 2;
    v.busy_min_s = 1;
    m.update(v);
    m.add_checkpoint(1.5, 0.25, 1000, 1e9);
    const std::string body = http_get(port, "/metrics");
    EXPECT_NE(body.find("apiary_step{rank=\"3\",run=\"myrun\"} 42"), std::string::npos) << body;
    EXPECT_NE(body.find("apiary_loss{rank=\"3\",run=\"myrun\"} 2.5"), std::string::npos);
    EXPECT_NE(body.find("apiary_tokens_per_second{rank=\"3\",run=\"myrun\"} 1234"),
              std::string::npos);
    // The straggler's series and the info series name the host it runs on.
    char host[256] = "";
    ::gethostname(host, sizeof(host) - 1);
    EXPECT_NE(body.find(fmt::format(
                  "apiary_straggler_ratio{{rank=\"3\",run=\"myrun\",host=\"{}\"}} 2", host)),
              std::string::npos)
        << body;
    EXPECT_NE(
        body.find(fmt::format("apiary_rank_info{{rank=\"3\",run=\"myrun\",host=\"{}\"}} 1", host)),
        std::string::npos);
    EXPECT_NE(body.find("apiary_checkpoint_seconds{rank=\"3\",run=\"myrun\"} 1.5"),
              std::string::npos);
    EXPECT_NE(body.find("apiary_temperature_celsius{rank=\"3\",run=\"myrun\",sensor=\"hwmon0/"
                        "coretemp/temp1\"} 61"),
              std::string::npos)
        << body;
    EXPECT_NE(body.find("apiary_process_resident_bytes{"), std::string::npos);
    // No clock sensor here: its series is absent, not zero.
    EXPECT_EQ(body.find("apiary_cpu_frequency_hertz"), std::string::npos);
}

TEST(Metrics, ServesTheExpertLoadOfMoeBlocks) {
    const int port = free_port();
    MetricsServer m("127.0.0.1", port, 1, "r", nullptr);
    StepValues v;
    v.step = 3;
    m.update(v);
    MoeLoad l;
    l.layer = 2;
    l.tokens = {30, 10};
    l.imbalance = 1.5;
    l.dropped = 4;
    m.set_moe_load({l});
    const std::string body = http_get(port, "/metrics");
    EXPECT_NE(body.find("apiary_moe_expert_tokens{rank=\"1\",run=\"r\",layer=\"2\",expert=\"0\"} "
                        "30"),
              std::string::npos)
        << body;
    EXPECT_NE(body.find("expert=\"1\"} 10"), std::string::npos);
    EXPECT_NE(body.find("apiary_moe_load_imbalance{rank=\"1\",run=\"r\",layer=\"2\"} 1.5"),
              std::string::npos);
    EXPECT_NE(body.find("apiary_moe_dropped_tokens{rank=\"1\",run=\"r\",layer=\"2\"} 4"),
              std::string::npos);
}

TEST(Metrics, IdleHalfSentRequestsDoNotBlockAScrape) {
    const int port = free_port();
    MetricsServer m("127.0.0.1", port, 0, "r", nullptr);
    StepValues v;
    v.step = 7;
    m.update(v);
    // More idle clients than the server has threads, each holding a
    // request that never ends (no blank line).
    std::vector<int> idle;
    for (int i = 0; i < kMetricsThreads + 2; ++i) {
        const int fd = connect_local(port);
        ASSERT_GE(fd, 0);
        const std::string partial = "GET /metrics HTTP/1.1\r\nHost: localhost\r\n";
        ASSERT_EQ(::write(fd, partial.data(), partial.size()), ssize_t(partial.size()));
        idle.push_back(fd);
    }
    // A scrape waits for a free thread: the idle ones are dropped after the
    // request timeout. Before, two threads waited 30 s on idle clients; the
    // bound here is far above the timeout and far below that.
    const int fd = connect_local(port);
    ASSERT_GE(fd, 0);
    timeval tv{};
    tv.tv_sec = 15;
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    const std::string req = "GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n";
    ASSERT_EQ(::write(fd, req.data(), req.size()), ssize_t(req.size()));
    std::string body;
    char buf[4096];
    for (ssize_t n; (n = ::read(fd, buf, sizeof(buf))) > 0;) body.append(buf, size_t(n));
    ::close(fd);
    for (int i : idle) ::close(i);
    EXPECT_NE(body.find("apiary_step{rank=\"0\",run=\"r\"} 7"), std::string::npos)
        << "no answer within 15 s while idle clients held the server: '" << body << "'";
}

TEST(Mfu, AbovePeakIsCappedAndFlagged) {
    // A peak measured while the cores were shared: 5x below what steps reach.
    const Mfu high = model_flops_utilisation(5e9, 1.0, 1e9, 1);
    EXPECT_DOUBLE_EQ(high.value, 1.0);
    EXPECT_TRUE(high.capped);
    const Mfu two_ranks = model_flops_utilisation(1e9, 2.0, 1e9, 2);
    EXPECT_DOUBLE_EQ(two_ranks.value, 0.25);
    EXPECT_FALSE(two_ranks.capped);
    EXPECT_DOUBLE_EQ(model_flops_utilisation(1e9, 0.0, 1e9, 1).value, 0.0);
}

TEST(Metrics, APortInUseIsAClearError) {
    const int port = free_port();
    MetricsServer first("127.0.0.1", port, 0, "r", nullptr);
    try {
        MetricsServer second("127.0.0.1", port, 1, "r", nullptr);
        FAIL() << "two servers on one port";
    } catch (const IoError& e) {
        EXPECT_NE(
            std::string(e.what()).find("cannot serve metrics on 127.0.0.1:" + std::to_string(port)),
            std::string::npos)
            << e.what();
    }
}

TEST(ScrapeTargets, PlacedBySlotAndWritten) {
    const auto local = place_targets(2, "", "127.0.0.1", 9400);
    ASSERT_EQ(local.size(), 2u);
    EXPECT_EQ(local[1].host, "127.0.0.1");
    EXPECT_EQ(local[1].port, 9401);
    const auto hosts = place_targets(5, "a:2,b:2", "0.0.0.0", 9000);
    std::vector<std::string> where;
    for (const auto& t : hosts) where.push_back(t.host + ":" + std::to_string(t.port));
    EXPECT_EQ(where, (std::vector<std::string>{"a:9000", "a:9001", "b:9002", "b:9003", "a:9004"}));
    EXPECT_THROW(place_targets(2, "a:x", "0.0.0.0", 9000), ConfigError);
    TempDir d;
    write_sd_targets(d / "sd/run.json", "run", local);
    const auto doc = nlohmann::json::parse(testing::read_file(d / "sd/run.json"));
    ASSERT_EQ(doc.size(), 2u);
    EXPECT_EQ(doc[1]["targets"][0], "127.0.0.1:9401");
    EXPECT_EQ(doc[1]["labels"]["apiary_rank"], "1");
    EXPECT_EQ(doc[1]["labels"]["apiary_host"], "127.0.0.1");
}

}  // namespace
}  // namespace apiary::obs
