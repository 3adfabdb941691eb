#pragma once
// A throwaway Ceph cluster on loopback for the s3:// tests: one monitor, one
// OSD that keeps its objects in memory (memstore) and radosgw serving S3 on a
// free port (beast frontend), all from Debian's packages, in one directory
// with its own ceph.conf. No systemd and no root-owned state: the daemons run
// in the foreground as children of the test, as the test's user.
//
// Cephx is off between the daemons (a one-host test cluster needs no keys),
// but radosgw's S3 authentication is not: requests must carry a valid SigV4
// signature of a user made with create_user().

#include <sys/types.h>

#include <string>
#include <vector>

namespace apiary::data::testing {

class CephCluster {
  public:
    // Whether the binaries are installed (scripts/install-deps.sh does it).
    static bool available();

    // Starts the cluster in `dir` and waits until radosgw answers; throws
    // std::runtime_error with the daemons' log tails when it cannot.
    explicit CephCluster(const std::string& dir);
    // Kills the daemons (even when a test failed part way).
    ~CephCluster();
    CephCluster(const CephCluster&) = delete;
    CephCluster& operator=(const CephCluster&) = delete;

    std::string endpoint() const;  // "http://127.0.0.1:<port>"
    void create_user(const std::string& uid, const std::string& access_key,
                     const std::string& secret_key) const;
    // The last lines of every daemon's log, for failure messages.
    std::string log_tails() const;

  private:
    void start();
    void stop();
    void spawn(const std::vector<std::string>& argv, const std::string& out);
    std::string run(const std::string& command) const;

    std::string dir_, conf_;
    int mon_port_ = 0, rgw_port_ = 0;
    std::vector<pid_t> pids_;
};

}  // namespace apiary::data::testing
