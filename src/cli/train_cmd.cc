// `apiary train [--config FILE] [--set key=value ...] [--overwrite]`

#include <fmt/format.h>

#include <filesystem>
#include <memory>

#include "cli/bench_common.h"
#include "cli/command.h"
#include "comm/mpi_backend.h"
#include "core/error.h"
#include "train/auto_layout.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

namespace apiary::cli {

namespace {

// 130: stopped by a signal; 75 (EX_TEMPFAIL): stopped for its health, to be
// moved by the scheduler. Both saved a checkpoint.
void exit_for(const train::TrainSummary& s) {
    if (!s.health_stop.empty()) {
        set_exit_code(75);
    } else if (s.interrupted) {
        set_exit_code(130);
    }
}

// parallel.layout = auto: the layout the planner finds fastest for the
// ranks and hosts of this launch (the same on every rank), said once.
core::Config laid_out(const core::Config& c, comm::ProcessGroup* world) {
    const train::LayoutChoice ch =
        train::choose_layout(c, world ? world->size() : 1, world ? ranks_per_host() : 1);
    if (ch.chosen && (!world || world->rank() == 0)) fmt::print(stderr, "apiary: {}\n", ch.report);
    return ch.config;
}

void setup(CLI::App& app) {
    auto* cmd = app.add_subcommand(
        "train", "train a model (no arguments: the tiny default model on the King James Bible)");
    static std::string config_file;
    static std::vector<std::string> sets;
    static bool overwrite = false;
    static std::string resume_dir;
    static bool previous_good = false;
    static bool auto_resume = false;
    cmd->add_option("--config", config_file, "TOML config file (keys: `apiary config keys`)")
        ->check(CLI::ExistingFile);
    cmd->add_option("--set", sets, "override a config key: --set train.lr=1e-3 (repeatable)");
    cmd->add_flag("--overwrite", overwrite, "replace an existing run directory");
    cmd->add_option("--resume", resume_dir,
                    "continue the run in this directory from its latest checkpoint, with its "
                    "config.toml (plus any --set)");
    cmd->add_flag("--resume-from-previous-good", previous_good,
                  "with --resume: if the latest checkpoint (or `latest` itself) is damaged, "
                  "continue from the newest one that verifies");
    cmd->add_flag("--auto-resume", auto_resume,
                  "continue run.dir from its latest checkpoint if it has one (falling back to "
                  "the newest one that verifies if it is damaged), else start it (for job "
                  "scripts that are requeued, and `apiary launch --max-restarts`)");
    cmd->callback([] {
        // Under mpirun/srun every rank runs this; one MPI session per process.
        MpiWorld mpi;
        comm::ProcessGroup*& world = mpi.world;
        auto start_mpi = [&](const core::Config& c) {
            mpi = start_mpi_world(comm::options_from(c));
        };
        if (auto_resume) {
            if (!resume_dir.empty()) {
                throw ConfigError(
                    "--auto-resume finds the run from run.dir: do not combine it "
                    "with --resume");
            }
            const std::string dir = load_config(config_file, sets).get_string("run.dir");
            const train::AutoResume a = train::auto_resume_policy(dir);
            if (a.resume) {
                resume_dir = dir;
                config_file.clear();
                std::erase_if(sets,
                              [](const std::string& s) { return s.rfind("run.dir=", 0) == 0; });
            } else {
                overwrite = a.overwrite;
            }
            previous_good = a.previous_good;
        }
        if (!resume_dir.empty()) {
            if (!config_file.empty() || overwrite) {
                throw ConfigError(
                    "--resume takes the run's own config.toml: do not combine it "
                    "with --config or --overwrite");
            }
            const std::string cfg = resume_dir + "/config.toml";
            if (!std::filesystem::exists(cfg)) {
                throw IoError(fmt::format("{}: missing; is {} a run directory?", cfg, resume_dir));
            }
            std::vector<std::string> all = sets;
            all.push_back("run.dir=" + resume_dir);
            const core::Config c = load_config(cfg, all);
            start_mpi(c);
            exit_for(train::resume_training(laid_out(c, world), world, previous_good));
            return;
        }
        if (previous_good) {
            throw ConfigError("--resume-from-previous-good goes with --resume RUN");
        }
        const core::Config c = load_config(config_file, sets);
        start_mpi(c);
        exit_for(train::run_training(laid_out(c, world), overwrite, world));
    });
}

// Ctrl-C, SIGTERM or SIGUSR1 finishes the step, saves a checkpoint and
// exits with 130.
CommandRegistrar reg("train", setup, true);

}  // namespace

}  // namespace apiary::cli
