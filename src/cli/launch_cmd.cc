// `apiary launch -n N -- <apiary args>`: runs N ranks of this same apiary
// binary under mpirun (or srun inside a Slurm allocation) with the flags a
// user otherwise has to remember: run-as-root in containers, oversubscription
// and no core binding when ranks x threads exceed the cores, and
// OMP_NUM_THREADS passed to every rank. --dry-run prints the command.
// A stop signal to `apiary launch` becomes SIGUSR1 to the ranks: each
// finishes its step, saves, and the job exits 130.

#include <fmt/format.h>

#include <string>

#include "cli/command.h"
#include "train/supervisor.h"

namespace apiary::cli {

namespace {

struct Options : train::LaunchOptions {
    bool dry_run = false;
};

void run(const Options& o) {
    const train::LaunchHost host = train::LaunchHost::here();
    if (o.dry_run) {
        fmt::print("{}\n", train::shell_line(train::launch_command(o, host)));
        return;
    }
    train::LaunchHooks hooks;
    hooks.on_targets = [](const std::string& targets) {
        fmt::print("apiary launch: scrape targets in {}\n", targets);
    };
    hooks.on_restart = [](const train::RestartNotice& n) {
        fmt::print(stderr,
                   "apiary launch: the job exited with {}; restart {} of {} on {} ranks from "
                   "{}\n",
                   n.exit_code, n.restart, n.max_restarts, n.ranks,
                   n.checkpoint.empty() ? "the start" : "checkpoint " + n.checkpoint);
    };
    set_exit_code(train::supervise(o, host, load_config, hooks));
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
