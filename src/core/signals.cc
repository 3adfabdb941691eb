#include "core/signals.h"

#include <fmt/format.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <thread>

#include "core/error.h"

namespace apiary::core {

namespace {

std::atomic<int> g_signal{0};
std::atomic<bool> g_graceful{false};
std::atomic<bool> g_started{false};

sigset_t stop_set() {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGUSR1);
    return set;
}

// Ends the process as the signal's default action would (the exit status a
// shell reports stays 128 + signal).
[[noreturn]] void die_by(int sig) {
    std::fflush(stdout);
    std::signal(sig, SIG_DFL);
    sigset_t one;
    sigemptyset(&one);
    sigaddset(&one, sig);
    pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
    raise(sig);
    _exit(128 + sig);  // not reached: the default action of these signals ends the process
}

void receive_loop(sigset_t set) {
    for (;;) {
        int sig = 0;
        if (sigwait(&set, &sig) != 0) continue;
        if (!g_graceful.load()) die_by(sig);
        int none = 0;
        if (!g_signal.compare_exchange_strong(none, sig)) {
            std::fprintf(stderr,
                         "\napiary: %s: a stop is already under way (the step or evaluation batch "
                         "finishes and a checkpoint is saved); SIGKILL ends the process "
                         "without one\n",
                         strsignal(sig));
        }
    }
}

}  // namespace

void block_stop_signals() {
    const sigset_t set = stop_set();
    const int rc = pthread_sigmask(SIG_BLOCK, &set, nullptr);
    APIARY_CHECK(rc == 0, "pthread_sigmask: {}", std::strerror(rc));
}

void start_signal_thread() {
    if (g_started.exchange(true)) return;
    block_stop_signals();
    std::thread(receive_loop, stop_set()).detach();
}

void unblock_stop_signals() {
    const sigset_t set = stop_set();
    pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
}

void enable_graceful_stop() { g_graceful.store(true); }

bool stop_requested() { return g_signal.load() != 0; }

int stop_signal() { return g_signal.load(); }

void request_stop(int signal_number) {
    int none = 0;
    g_signal.compare_exchange_strong(none, signal_number);
}

}  // namespace apiary::core
