#pragma once
// Each `apiary <verb>` lives in its own file and registers itself here, so a
// new verb touches no shared file. The CLI sources are compiled straight into
// the executable (not a static library), so the registrars are never dropped.

#include <CLI/CLI.hpp>
#include <functional>
#include <string>

#include "core/config.h"

namespace apiary::cli {

using CommandSetup = void (*)(CLI::App& app);

// graceful_stop: a stop signal (SIGINT, SIGTERM, SIGUSR1) only requests a
// stop, which the verb honours at a safe point (core/signals.h); decided
// before the command line is parsed, so no signal is ever lost in between.
// Other verbs end on a stop signal as usual.
struct CommandRegistrar {
    CommandRegistrar(const char* name, CommandSetup setup, bool graceful_stop = false);
};

// Called before exit on a fatal error, e.g. to abort an MPI communicator so
// that no peer rank hangs. Set by whoever initialises a communicator.
void set_abort_hook(std::function<void(int exit_code)> hook);

// The exit code main returns when the verb finishes without an exception
// (e.g. 130 after a run stopped by a signal saved its checkpoint).
void set_exit_code(int code);

// The schema of every config key from every layer (docs are generated from it).
const core::Schema& full_schema();
// Builds a config from defaults, an optional TOML file and --set overrides.
core::Config load_config(const std::string& config_file, const std::vector<std::string>& sets);

}  // namespace apiary::cli
