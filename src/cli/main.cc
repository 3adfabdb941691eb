// apiary: one executable, one verb per file (see command.h).

#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <new>
#include <thread>
#include <utility>
#include <vector>

#include "cli/command.h"
#include "comm/mpi_backend.h"
#include "core/error.h"
#include "core/signals.h"

namespace apiary::cli {

namespace {

std::vector<std::pair<std::string, CommandSetup>>& registry() {
    static std::vector<std::pair<std::string, CommandSetup>> r;
    return r;
}

std::vector<std::string>& graceful_commands() {
    static std::vector<std::string> r;
    return r;
}

std::function<void(int)>& abort_hook() {
    static std::function<void(int)> hook;
    return hook;
}

}  // namespace

CommandRegistrar::CommandRegistrar(const char* name, CommandSetup setup, bool graceful_stop) {
    registry().emplace_back(name, setup);
    if (graceful_stop) graceful_commands().emplace_back(name);
}

void set_abort_hook(std::function<void(int)> hook) { abort_hook() = std::move(hook); }

namespace {
int g_exit_code = 0;
}
void set_exit_code(int code) { g_exit_code = code; }

}  // namespace apiary::cli

namespace {
// The stop signals are blocked before main, as the executable's first static
// initialiser (priority 101 runs before every default-priority one), so a
// signal that lands while the program is still being set up waits, pending,
// for the signal thread instead of ending the process. Only the dynamic
// loader's own few milliseconds before this remain, when no code of ours runs
// and there is nothing to save.
__attribute__((constructor(101))) void block_stop_signals_early() {
    apiary::core::block_stop_signals();
}
}  // namespace

int main(int argc, char** argv) {
    using namespace apiary;
    // Before any other thread exists: every thread inherits the blocked stop
    // signals, and one thread of their own receives them (core/signals.h).
    // Graceful first: a signal already pending is taken as soon as the
    // thread starts, and must find the verb's choice made.
    const auto& graceful = cli::graceful_commands();
    if (argc > 1 && std::find(graceful.begin(), graceful.end(), argv[1]) != graceful.end()) {
        core::enable_graceful_stop();
    }
    core::start_signal_thread();
    CLI::App app{"apiary: train transformer language models, and plan their runs"};
    app.require_subcommand(1);
    app.set_version_flag("--version", "apiary 0.1.0");
    auto& commands = cli::registry();
    std::sort(commands.begin(), commands.end());
    for (const auto& [name, setup] : commands) setup(app);

    int code = 0;
    const int rank = comm::launch_rank();
    try {
        app.parse(argc, argv);
        code = cli::g_exit_code;
    } catch (const CLI::ParseError& e) {
        code = app.exit(e);
        // CLI11 uses 0 for --help; anything else is a usage error.
        if (code != 0) code = 2;
    } catch (const ConfigError& e) {
        // Every rank checks the same config and fails alike: the first one
        // says so; the others give it time to before the job is aborted.
        std::fflush(stdout);
        if (rank <= 0) {
            fmt::print(stderr, "apiary: error: {}\n", e.what());
        } else {
            std::this_thread::sleep_for(std::chrono::milliseconds(500));
        }
        code = 1;
    } catch (const Error& e) {
        std::fflush(stdout);
        fmt::print(stderr, "apiary: error: {}{}\n", rank > 0 ? fmt::format("rank {}: ", rank) : "",
                   e.what());
        code = 1;
    } catch (const std::bad_alloc&) {
        std::fflush(stdout);
        fmt::print(stderr,
                   "apiary: error: out of memory (an allocation outside the model's "
                   "accounted buffers failed); lower train.batch_size or shard the model "
                   "over more ranks\n");
        code = 1;
    } catch (const std::exception& e) {
        std::fflush(stdout);
        fmt::print(stderr, "apiary: internal error: {}\n", e.what());
        code = 3;
    }
    if (code != 0 && cli::abort_hook()) cli::abort_hook()(code);
    return code;
}
