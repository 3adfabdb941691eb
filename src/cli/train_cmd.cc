// `apiary train [--config FILE] [--set key=value ...] [--overwrite]`

#include <csignal>

#include "cli/command.h"
#include "train/trainer.h"

namespace apiary::cli {

namespace {

void on_signal(int) { train::g_stop_requested.store(true); }

void setup(CLI::App& app) {
    auto* cmd = app.add_subcommand(
        "train", "train a model (no arguments: the tiny default model on the King James Bible)");
    static std::string config_file;
    static std::vector<std::string> sets;
    static bool overwrite = false;
    cmd->add_option("--config", config_file, "TOML config file (keys: `apiary config keys`)")
        ->check(CLI::ExistingFile);
    cmd->add_option("--set", sets, "override a config key: --set train.lr=1e-3 (repeatable)");
    cmd->add_flag("--overwrite", overwrite, "replace an existing run directory");
    cmd->callback([] {
        const core::Config config = load_config(config_file, sets);
        // Ctrl-C finishes the step, saves a checkpoint and exits cleanly.
        std::signal(SIGINT, on_signal);
        std::signal(SIGTERM, on_signal);
        train::run_training(config, overwrite);
    });
}

CommandRegistrar reg("train", setup);

}  // namespace

}  // namespace apiary::cli
