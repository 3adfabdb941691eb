#include "train/supervisor.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "core/signals.h"
#include "core/threads.h"

namespace apiary::train {

namespace {

std::string self_path() {
    char buf[PATH_MAX];
    const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
    if (n <= 0) throw IoError("launch: cannot read /proc/self/exe to find the apiary binary");
    return std::string(buf, size_t(n));
}

bool on_path(const std::string& prog) {
    const char* path = std::getenv("PATH");
    if (!path) return false;
    std::string p = path;
    size_t start = 0;
    while (start <= p.size()) {
        const size_t end = p.find(':', start);
        const std::string dir =
            p.substr(start, end == std::string::npos ? std::string::npos : end - start);
        if (!dir.empty() && ::access((dir + "/" + prog).c_str(), X_OK) == 0) return true;
        if (end == std::string::npos) break;
        start = end + 1;
    }
    return false;
}

std::string quote(const std::string& s) {
    if (s.find_first_of(" \t\"'\\$`*?[]{}()<>|&;") == std::string::npos && !s.empty()) return s;
    std::string out = "'";
    for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return out + "'";
}

// A supervised train run continues from its latest checkpoint.
std::vector<std::string> supervised_args(const LaunchOptions& o) {
    std::vector<std::string> args = o.args;
    const bool train = !args.empty() && args[0] == "train";
    if (o.max_restarts > 0 && train &&
        std::find(args.begin(), args.end(), "--auto-resume") == args.end() &&
        std::find(args.begin(), args.end(), "--resume") == args.end()) {
        args.insert(args.begin() + 1, "--auto-resume");
    }
    return args;
}

std::string latest_of(const std::string& run_dir) {
    std::ifstream in(std::filesystem::path(run_dir) / "ckpt" / "latest");
    std::string name;
    std::getline(in, name);
    return name;
}

}  // namespace

LaunchHost LaunchHost::here() {
    LaunchHost h;
    h.slurm = std::getenv("SLURM_JOB_ID") && on_path("srun");
    h.root = ::geteuid() == 0;
    h.cores = core::available_cores();
    h.self = self_path();
    return h;
}

std::vector<std::string> launch_command(const LaunchOptions& o, const LaunchHost& host) {
    if (o.args.empty()) {
        throw ConfigError(
            "launch: nothing to run; give the apiary verb after --, e.g. "
            "`apiary launch -n 2 -- train --config run.toml`");
    }
    if (o.args[0] == "launch") throw ConfigError("launch: cannot launch `launch` itself");
    std::string launcher = o.launcher;
    if (launcher == "auto") launcher = host.slurm ? "srun" : "mpirun";
    const std::string omp = fmt::format("OMP_NUM_THREADS={}", o.threads);
    std::vector<std::string> cmd;
    if (launcher == "srun") {
        // Inside an allocation: srun places ranks; the environment (with
        // OMP_NUM_THREADS) is exported to every task by default.
        cmd = {"env",
               omp,
               "srun",
               "-n",
               std::to_string(o.ranks),
               fmt::format("--cpus-per-task={}", o.threads),
               "--kill-on-bad-exit=1"};
    } else {
        cmd = {"mpirun", "-n", std::to_string(o.ranks), "-x", omp};
        if (host.root) cmd.push_back("--allow-run-as-root");
        if (o.ranks * o.threads >= host.cores) {
            // Every rank also has communication threads that wait inside MPI;
            // with no core to spare, MPI's busy polling must yield to compute.
            cmd.insert(cmd.end(), {"--mca", "mpi_yield_when_idle", "1"});
        }
        if (!o.hosts.empty()) {
            // A host that dies silently (power, kernel, cable) sends no FIN:
            // without keepalives on its daemon's connection mpirun waits for
            // it forever and --max-restarts never restarts (tests/cluster:
            // the job ends about 11 s after the crash with these).
            cmd.insert(cmd.end(),
                       {"--host", o.hosts, "--mca", "oob_tcp_keepalive_time", "5", "--mca",
                        "oob_tcp_keepalive_intvl", "2", "--mca", "oob_tcp_keepalive_probes", "3"});
            // With one TCP socket between two ranks, OpenMPI 4.1 moves data
            // one way at a time: a 2-rank exchange (MPI_Sendrecv, the ring
            // of two, a pipeline's forward and backward) runs at half the
            // link's rate. Two sockets per pair restore both directions
            // (tests/cluster, BENCHMARKS.md "Many hosts: collectives").
            cmd.insert(cmd.end(), {"--mca", "btl_tcp_links", "2"});
        } else if (o.ranks * o.threads > host.cores) {
            // More ranks x threads than cores here: allow it, and do not pin
            // several ranks to one core.
            cmd.insert(cmd.end(), {"--oversubscribe", "--bind-to", "none"});
        } else if (o.threads > 1) {
            cmd.insert(cmd.end(),
                       {"--map-by", fmt::format("slot:PE={}", o.threads), "--bind-to", "core"});
        }
    }
    cmd.insert(cmd.end(), o.extra.begin(), o.extra.end());
    cmd.push_back(host.self);
    const std::vector<std::string> args = supervised_args(o);
    cmd.insert(cmd.end(), args.begin(), args.end());
    return cmd;
}

std::string shell_line(const std::vector<std::string>& cmd) {
    std::string line;
    for (const auto& a : cmd) {
        if (!line.empty()) line += ' ';
        line += quote(a);
    }
    return line;
}

bool restarts_after(int exit_code) {
    // 75: stopped for its health (health.action = checkpoint): the scheduler
    // moves it; a restart here would meet the same hot machine.
    return exit_code != 0 && exit_code != 130 && exit_code != 75;
}

int ranks_for_restart(int ranks, int min_ranks, int restart, bool progressed) {
    if (min_ranks > 0 && restart > 1 && !progressed && ranks / 2 >= min_ranks) return ranks / 2;
    return ranks;
}

std::string run_dir_of(const std::vector<std::string>& args, const ConfigLoader& load_config) {
    if (args.empty() || args[0] != "train") return "";
    std::string config;
    std::vector<std::string> sets;
    for (size_t i = 1; i + 1 < args.size(); ++i) {
        if (args[i] == "--config") config = args[i + 1];
        if (args[i] == "--set") sets.push_back(args[i + 1]);
        if (args[i] == "--resume") return args[i + 1];
    }
    try {
        return load_config(config, sets).get_string("run.dir");
    } catch (const Error&) {
        return "";  // the ranks report the config error themselves
    }
}

int run_child(const std::vector<std::string>& cmd, int restart) {
    std::vector<char*> argv;
    for (const auto& a : cmd) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    if (restart > 0) ::setenv("APIARY_RESTART", std::to_string(restart).c_str(), 1);
    std::fflush(stdout);
    const pid_t pid = ::fork();
    if (pid < 0) throw IoError(fmt::format("launch: fork: {}", std::strerror(errno)));
    if (pid == 0) {
        // Its own process group: a Ctrl-C at the terminal reaches this
        // process only (mpirun would end the ranks on SIGINT); with stdin
        // from /dev/null it never reads the terminal from the background;
        // and it ends if this process is killed.
        ::setpgid(0, 0);
        const int null_fd = ::open("/dev/null", O_RDONLY);
        if (null_fd >= 0) ::dup2(null_fd, STDIN_FILENO);
        ::prctl(PR_SET_PDEATHSIG, SIGTERM);
        core::unblock_stop_signals();  // the launcher handles its own signals
        ::execvp(argv[0], argv.data());
        std::fprintf(stderr,
                     "apiary: error: launch: cannot run %s (is it installed? "
                     "scripts/install-deps.sh installs openmpi-bin)\n",
                     argv[0]);
        std::fflush(stderr);
        ::_exit(127);
    }
    bool forwarded = false;
    for (;;) {
        int status = 0;
        const pid_t r = ::waitpid(pid, &status, WNOHANG);
        if (r == pid) {
            if (WIFEXITED(status)) return WEXITSTATUS(status);
            return 128 + WTERMSIG(status);
        }
        if (r < 0 && errno != EINTR) {
            throw IoError(fmt::format("launch: waitpid: {}", std::strerror(errno)));
        }
        if (core::stop_requested() && !forwarded) {
            ::kill(pid, SIGUSR1);
            forwarded = true;
        }
        ::usleep(20000);
    }
}

int supervise(LaunchOptions o, const LaunchHost& host, const ConfigLoader& load_config,
              const LaunchHooks& hooks) {
    const auto run_once = [&](int restart) {
        const auto cmd = launch_command(o, host);
        // Prometheus finds the ranks' metrics endpoints in this file.
        const std::string targets =
            write_launch_targets(o.ranks, o.hosts, supervised_args(o), load_config);
        if (!targets.empty() && hooks.on_targets) hooks.on_targets(targets);
        return hooks.run ? hooks.run(cmd, restart) : run_child(cmd, restart);
    };
    const std::string run_dir = o.max_restarts > 0 ? run_dir_of(o.args, load_config) : "";
    std::string before = latest_of(run_dir);
    int code = run_once(0);
    for (int restart = 1; restart <= o.max_restarts && restarts_after(code); ++restart) {
        const std::string now = latest_of(run_dir);
        o.ranks = ranks_for_restart(o.ranks, o.min_ranks, restart, now != before);
        before = now;
        if (hooks.on_restart) hooks.on_restart({code, restart, o.max_restarts, o.ranks, now});
        code = run_once(restart);
    }
    return code;
}

}  // namespace apiary::train
