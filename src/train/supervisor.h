#pragma once
// The supervision behind `apiary launch` (cli/launch_cmd.cc parses its
// options and prints): the mpirun or srun command line for N ranks of this
// same binary, one run of it as a child in its own process group, to which
// a stop signal is forwarded as SIGUSR1, and --max-restarts' policy (which
// exits restart, and --min-ranks' halving), each callable without the binary.

#include <functional>
#include <string>
#include <vector>

#include "train/launch_targets.h"

namespace apiary::train {

// What `apiary launch` was asked to do.
struct LaunchOptions {
    int ranks = 2;
    int threads = 1;
    std::string launcher = "auto";   // auto, mpirun or srun
    std::string hosts;               // mpirun --host list, e.g. node1:4,node2:4
    std::vector<std::string> extra;  // --launcher-arg
    int max_restarts = 0;
    int min_ranks = 0;
    std::vector<std::string> args;  // the apiary command after --
};

// What the command line depends on besides the options: the machine it is
// built on. here() reads them from this process and its environment.
struct LaunchHost {
    bool slurm = false;  // inside a Slurm allocation (SLURM_JOB_ID) with srun on PATH
    bool root = false;
    int cores = 1;
    std::string self;  // this apiary binary
    static LaunchHost here();
};

// The launcher's command line: mpirun or srun, its flags, this binary and
// the apiary command (with --auto-resume added to a supervised train run
// that does not resume already). Throws ConfigError when there is nothing
// to run or the command is `launch` itself.
std::vector<std::string> launch_command(const LaunchOptions& o, const LaunchHost& host);

// The command as one shell line, each argument quoted where a shell needs it.
std::string shell_line(const std::vector<std::string>& cmd);

// The restart policy of --max-restarts: whether a job that exited with
// `exit_code` is started again (not when it completed, nor when a stop
// signal ended it with 130, nor when it stopped for its health with 75).
bool restarts_after(int exit_code);

// The ranks of restart number `restart` (1, 2, ...) after a run on `ranks`:
// with --min-ranks, a restart that fails again without a new checkpoint
// (`progressed` false) halves the ranks, not below the minimum.
int ranks_for_restart(int ranks, int min_ranks, int restart, bool progressed);

// The run directory a `train` command writes (for progress between
// restarts), or "" when the command is not training.
std::string run_dir_of(const std::vector<std::string>& args, const ConfigLoader& load_config);

// What the supervisor reports; cli/ prints it.
struct RestartNotice {
    int exit_code = 0;
    int restart = 0;  // 1, 2, ... of max_restarts
    int max_restarts = 0;
    int ranks = 0;
    std::string checkpoint;  // the checkpoint it continues from, "" for the start
};
struct LaunchHooks {
    std::function<void(const std::string& targets_file)> on_targets;
    std::function<void(const RestartNotice&)> on_restart;
    // Runs one attempt and returns its exit status; run_child unless a test
    // stands in for the launcher.
    std::function<int(const std::vector<std::string>& cmd, int restart)> run;
};

// Runs the launcher as a child and waits for it, so that a stop signal sent
// to `apiary launch` reaches every rank: mpirun ends its ranks on SIGINT or
// SIGTERM without letting them save, but forwards SIGUSR1 (as srun does),
// which the ranks take as a stop request. The exit status is the launcher's.
// restart > 0 is passed to the ranks as APIARY_RESTART (the trainer's
// restart event).
int run_child(const std::vector<std::string>& cmd, int restart);

// With --max-restarts the job is supervised: when it fails (not when it
// completes, nor when a stop signal ended it with 130) it is started again,
// continuing from its latest checkpoint, up to the limit. With --min-ranks,
// a restart that fails again without a new checkpoint halves the ranks
// (not below the minimum): a rank that cannot come back is left out.
// Returns the last run's exit status.
int supervise(LaunchOptions o, const LaunchHost& host, const ConfigLoader& load_config,
              const LaunchHooks& hooks);

}  // namespace apiary::train
