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

#include <algorithm>
#include <cerrno>
#include <climits>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
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
    int max_restarts = 0;
    int min_ranks = 0;
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

// The run directory a `train` command writes (for progress between
// restarts), or "" when the command is not training.
std::string run_dir_of(const std::vector<std::string>& args) {
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

std::string latest_of(const std::string& run_dir) {
    std::ifstream in(std::filesystem::path(run_dir) / "ckpt" / "latest");
    std::string name;
    std::getline(in, name);
    return name;
}

int run_once(const Options& o, int restart) {
    const auto cmd = build(o);
    std::string line;
    for (const auto& a : cmd) line += (line.empty() ? "" : " ") + quote(a);
    if (o.dry_run) {
        fmt::print("{}\n", line);
        return 0;
    }
    // Prometheus finds the ranks' metrics endpoints in this file.
    const std::string targets = write_launch_targets(o.ranks, o.hosts, o.args);
    if (!targets.empty()) fmt::print("apiary launch: scrape targets in {}\n", targets);
    std::vector<char*> argv;
    for (const auto& a : cmd) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    if (restart > 0) ::setenv("APIARY_RESTART", std::to_string(restart).c_str(), 1);
    std::fflush(stdout);
    return supervise(argv);
}

// With --max-restarts the job is supervised: when it fails (not when it
// completes, nor when a stop signal ended it with 130) it is started again,
// continuing from its latest checkpoint, up to the limit. With --min-ranks,
// a restart that fails again without a new checkpoint halves the ranks
// (not below the minimum): a rank that cannot come back is left out.
void run(Options o) {
    const bool train = !o.args.empty() && o.args[0] == "train";
    if (o.max_restarts > 0 && train &&
        std::find(o.args.begin(), o.args.end(), "--auto-resume") == o.args.end() &&
        std::find(o.args.begin(), o.args.end(), "--resume") == o.args.end()) {
        o.args.insert(o.args.begin() + 1, "--auto-resume");
    }
    const std::string run_dir = o.max_restarts > 0 ? run_dir_of(o.args) : "";
    std::string before = latest_of(run_dir);
    int code = run_once(o, 0);
    // 75: stopped for its health (health.action = checkpoint): the scheduler
    // moves it; a restart here would meet the same hot machine.
    for (int restart = 1; restart <= o.max_restarts && code != 0 && code != 130 && code != 75;
         ++restart) {
        const std::string now = latest_of(run_dir);
        if (o.min_ranks > 0 && restart > 1 && now == before && o.ranks / 2 >= o.min_ranks) {
            o.ranks /= 2;
        }
        before = now;
        fmt::print(stderr,
                   "apiary launch: the job exited with {}; restart {} of {} on {} ranks from "
                   "{}\n",
                   code, restart, o.max_restarts, o.ranks,
                   now.empty() ? "the start" : "checkpoint " + now);
        code = run_once(o, restart);
    }
    set_exit_code(code);
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
    cmd->add_option("--max-restarts", o.max_restarts,
                    "supervise the job: restart it from its latest checkpoint when it fails, up "
                    "to this many times (train runs get --auto-resume)")
        ->check(CLI::Range(0, 1000))
        ->capture_default_str();
    cmd->add_option("--min-ranks", o.min_ranks,
                    "with --max-restarts: a restart that fails again without progress halves the "
                    "ranks, not below this (the run needs train.elastic to keep its batch)")
        ->check(CLI::Range(0, 1 << 20));
    cmd->callback([] { run(o); });
}

CommandRegistrar reg("launch", setup, true);

}  // namespace

}  // namespace apiary::cli
