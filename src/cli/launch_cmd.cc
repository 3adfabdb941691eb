// `apiary launch -n N -- <apiary args>`: runs N ranks of this same apiary
// binary under mpirun (or srun inside a Slurm allocation) with the flags a
// user otherwise has to remember: run-as-root in containers, oversubscription
// and no core binding when ranks x threads exceed the cores, and
// OMP_NUM_THREADS passed to every rank. --dry-run prints the command.
// A stop signal to `apiary launch` becomes SIGUSR1 to the ranks: each
// finishes its step, saves, and the job exits 130.

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cli/command.h"
#include "cli/launch_targets.h"
#include "core/error.h"
#include "core/signals.h"
#include "core/threads.h"

namespace apiary::cli {

namespace {

struct Options {
    int ranks = 2;
    int threads = 1;
    std::string launcher = "auto";
    std::string hosts;
    std::vector<std::string> extra;
    bool dry_run = false;
    std::vector<std::string> args;
};

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

std::vector<std::string> build(const Options& o) {
    if (o.args.empty()) {
        throw ConfigError(
            "launch: nothing to run; give the apiary verb after --, e.g. "
            "`apiary launch -n 2 -- train --config run.toml`");
    }
    if (o.args[0] == "launch") throw ConfigError("launch: cannot launch `launch` itself");
    std::string launcher = o.launcher;
    if (launcher == "auto") {
        launcher = std::getenv("SLURM_JOB_ID") && on_path("srun") ? "srun" : "mpirun";
    }
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
        if (::geteuid() == 0) cmd.push_back("--allow-run-as-root");
        if (o.ranks * o.threads >= core::available_cores()) {
            // Every rank also has communication threads that wait inside MPI;
            // with no core to spare, MPI's busy polling must yield to compute.
            cmd.insert(cmd.end(), {"--mca", "mpi_yield_when_idle", "1"});
        }
        if (!o.hosts.empty()) {
            cmd.insert(cmd.end(), {"--host", o.hosts});
        } else if (o.ranks * o.threads > core::available_cores()) {
            // More ranks x threads than cores here: allow it, and do not pin
            // several ranks to one core.
            cmd.insert(cmd.end(), {"--oversubscribe", "--bind-to", "none"});
        } else if (o.threads > 1) {
            cmd.insert(cmd.end(),
                       {"--map-by", fmt::format("slot:PE={}", o.threads), "--bind-to", "core"});
        }
    }
    cmd.insert(cmd.end(), o.extra.begin(), o.extra.end());
    cmd.push_back(self_path());
    cmd.insert(cmd.end(), o.args.begin(), o.args.end());
    return cmd;
}

// Runs the launcher as a child and waits for it, so that a stop signal sent
// to `apiary launch` reaches every rank: mpirun ends its ranks on SIGINT or
// SIGTERM without letting them save, but forwards SIGUSR1 (as srun does),
// which the ranks take as a stop request. The exit status is the launcher's.
int supervise(std::vector<char*>& argv) {
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

void run(const Options& o) {
    const auto cmd = build(o);
    std::string line;
    for (const auto& a : cmd) line += (line.empty() ? "" : " ") + quote(a);
    if (o.dry_run) {
        fmt::print("{}\n", line);
        return;
    }
    // Prometheus finds the ranks' metrics endpoints in this file.
    const std::string targets = write_launch_targets(o.ranks, o.hosts, o.args);
    if (!targets.empty()) fmt::print("apiary launch: scrape targets in {}\n", targets);
    std::vector<char*> argv;
    for (const auto& a : cmd) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    std::fflush(stdout);
    set_exit_code(supervise(argv));
}

void setup(CLI::App& app) {
    auto* cmd = app.add_subcommand(
        "launch", "run N ranks of an apiary command under mpirun (or srun inside Slurm)");
    static Options o;
    cmd->add_option("-n,--ranks", o.ranks, "number of ranks")
        ->check(CLI::Range(1, 1 << 20))
        ->capture_default_str();
    cmd->add_option("-t,--threads", o.threads, "compute threads per rank (OMP_NUM_THREADS)")
        ->check(CLI::Range(1, 4096))
        ->capture_default_str();
    cmd->add_option("--launcher", o.launcher,
                    "auto (srun inside a Slurm allocation, else "
                    "mpirun), mpirun or srun")
        ->check(CLI::IsMember({"auto", "mpirun", "srun"}))
        ->capture_default_str();
    cmd->add_option("--hosts", o.hosts, "mpirun --host list, e.g. node1:4,node2:4");
    cmd->add_option("--launcher-arg", o.extra, "extra argument for the launcher (repeatable)")
        ->allow_extra_args(false);
    cmd->add_flag("--dry-run", o.dry_run, "print the command instead of running it");
    cmd->add_option("args", o.args, "the apiary command to run, after --");
    cmd->callback([] { run(o); });
}

CommandRegistrar reg("launch", setup, true);

}  // namespace

}  // namespace apiary::cli
