#include "ceph_cluster.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "test_util.h"

namespace apiary::data::testing {

namespace fs = std::filesystem;

namespace {

constexpr const char* kBinaries[] = {"/usr/bin/ceph-mon", "/usr/bin/ceph-osd",
                                     "/usr/bin/radosgw",  "/usr/bin/radosgw-admin",
                                     "/usr/bin/ceph",     "/usr/bin/monmaptool"};

std::string tail(const std::string& path, size_t lines) {
    std::ifstream in(path);
    std::vector<std::string> all;
    for (std::string line; std::getline(in, line);) all.push_back(line);
    std::string out;
    for (size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i) {
        out += all[i] + "\n";
    }
    return out;
}

}  // namespace

bool CephCluster::available() {
    for (const char* b : kBinaries) {
        if (!fs::exists(b)) return false;
    }
    return true;
}

CephCluster::CephCluster(const std::string& dir) : dir_(dir), conf_(dir + "/ceph.conf") {
    try {
        start();
    } catch (const std::exception& e) {
        stop();  // no destructor runs after a throwing constructor
        throw std::runtime_error(std::string(e.what()) + "\n" + log_tails());
    }
}

CephCluster::~CephCluster() { stop(); }

void CephCluster::stop() {
    // SIGKILL, not SIGTERM: the cluster's state is thrown away, and a clean
    // radosgw shutdown takes seconds that a test has no use for.
    for (const pid_t pid : pids_) ::kill(pid, SIGKILL);
    for (const pid_t pid : pids_) ::waitpid(pid, nullptr, 0);
    pids_.clear();
}

std::string CephCluster::endpoint() const { return fmt::format("http://127.0.0.1:{}", rgw_port_); }

void CephCluster::start() {
    for (const char* sub : {"log", "run", "mon", "osd/ceph-0", "rgw"}) {
        fs::create_directories(dir_ + "/" + sub);
    }
    mon_port_ = free_port();
    rgw_port_ = free_port();
    std::string fsid;
    std::ifstream("/proc/sys/kernel/random/uuid") >> fsid;
    std::ofstream(conf_) << fmt::format(R"([global]
fsid = {fsid}
mon host = v2:127.0.0.1:{mon}
mon initial members = a
public network = 127.0.0.0/8
ms bind ipv6 = false
ms bind msgr1 = false
# No cephx between the daemons of this one-host cluster; S3 auth stays on.
auth cluster required = none
auth service required = none
auth client required = none
run dir = {dir}/run
log file = {dir}/log/$name.log
pid file = {dir}/run/$name.pid
# No admin sockets: their path could exceed the 108 bytes of a socket address.
admin socket =
mon data = {dir}/mon/$name
osd data = {dir}/osd/ceph-$id
osd objectstore = memstore
memstore device bytes = 268435456
osd pool default size = 1
osd pool default min size = 1
mon allow pool size one = true
mon warn on pool no redundancy = false
osd crush chooseleaf type = 0
# One placement group per pool, and quick paxos rounds: radosgw creates its
# pools one after another at startup, and each waits for a new osdmap.
osd pool default pg autoscale mode = off
osd pool default pg num = 1
osd pool default pgp num = 1
paxos propose interval = 0.1
paxos min wait = 0.01
[client.rgw.a]
rgw frontends = beast endpoint=127.0.0.1:{rgw}
rgw data = {dir}/rgw
# radosgw's built-in defaults ask for cephx to the monitor.
auth client required = none
ms mon client mode = crc
)",
                                        fmt::arg("fsid", fsid), fmt::arg("mon", mon_port_),
                                        fmt::arg("rgw", rgw_port_), fmt::arg("dir", dir_));

    run(fmt::format("monmaptool --create --addv a '[v2:127.0.0.1:{}]' --fsid {} '{}/monmap'",
                    mon_port_, fsid, dir_));
    run(fmt::format("ceph-mon -c '{}' --mkfs -i a --monmap '{}/monmap'", conf_, dir_));
    spawn({"ceph-mon", "-c", conf_, "-i", "a", "-f"}, "mon.a.out");
    // The OSD must be in the osdmap before it boots; the CLI waits for the monitor.
    run(fmt::format("ceph -c '{}' --connect-timeout 30 osd create", conf_));
    run(fmt::format("ceph-osd -c '{}' -i 0 --mkfs", conf_));
    spawn({"ceph-osd", "-c", conf_, "-i", "0", "-f"}, "osd.0.out");
    spawn({"radosgw", "-c", conf_, "-n", "client.rgw.a", "-f"}, "rgw.a.out");
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!can_connect(rgw_port_)) {
        for (size_t i = 0; i < pids_.size(); ++i) {
            if (::waitpid(pids_[i], nullptr, WNOHANG) == pids_[i]) {
                const pid_t pid = pids_[i];
                pids_.erase(pids_.begin() + i);  // reaped: never signal its number again
                throw std::runtime_error(
                    fmt::format("a Ceph daemon (pid {}) exited during startup", pid));
            }
        }
        if (std::chrono::steady_clock::now() > deadline) {
            throw std::runtime_error(
                fmt::format("radosgw did not listen on port {} within 60 s", rgw_port_));
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
}

void CephCluster::spawn(const std::vector<std::string>& argv, const std::string& out) {
    const std::string out_path = dir_ + "/log/" + out;
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid == 0) {
        // Dies with the test, even when the test process is killed.
        ::prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (::getppid() != parent) ::_exit(1);
        const int fd = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        ::dup2(fd, 1);
        ::dup2(fd, 2);
        std::vector<char*> args;
        for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
        args.push_back(nullptr);
        ::execvp(args[0], args.data());
        ::_exit(127);
    }
    if (pid < 0) throw std::runtime_error("fork failed for " + argv[0]);
    pids_.push_back(pid);
}

std::string CephCluster::run(const std::string& command) const {
    const std::string full = "timeout 60 " + command + " 2>&1";
    FILE* p = ::popen(full.c_str(), "r");
    if (!p) throw std::runtime_error("cannot run: " + command);
    std::string out;
    char buf[4096];
    while (size_t n = std::fread(buf, 1, sizeof(buf), p)) out.append(buf, n);
    const int rc = ::pclose(p);
    if (rc != 0) {
        throw std::runtime_error(
            fmt::format("command failed (status {}): {}\n{}", rc, command, out));
    }
    return out;
}

void CephCluster::create_user(const std::string& uid, const std::string& access_key,
                              const std::string& secret_key) const {
    run(fmt::format(
        "radosgw-admin -c '{}' user create --uid '{}' --display-name '{}' --access-key '{}' "
        "--secret-key '{}'",
        conf_, uid, uid, access_key, secret_key));
}

std::string CephCluster::log_tails() const {
    std::ostringstream out;
    std::error_code ec;
    if (!fs::exists(dir_ + "/log", ec)) return "";
    for (const auto& e : fs::directory_iterator(dir_ + "/log", ec)) {
        out << "--- " << e.path().filename().string() << "\n" << tail(e.path().string(), 15);
    }
    return out.str();
}

}  // namespace apiary::data::testing
