#pragma once
// Stop signals (SIGINT, SIGTERM, SIGUSR1) are received on one thread of
// their own, never on a compute thread.
//
// Why: a handler runs on whichever thread the kernel picks, and oneDNN's JIT
// sgemm runs with its stack pointer in heap memory; a signal delivered there
// (even to a handler that only sets a flag) corrupts the heap ("double free",
// SIGABRT). Blocking the signals in the first thread, before any other
// exists, makes every later thread (OpenMP, oneDNN, MPI's progress threads)
// inherit the mask; one dedicated thread takes them with sigwait.

namespace apiary::core {

// Blocks the stop signals in the calling thread only; a signal that arrives
// stays pending until start_signal_thread's thread takes it.
void block_stop_signals();

// Blocks the stop signals in the calling thread and starts the thread that
// receives them. Call first thing in main, before any thread is created.
// Until graceful stops are enabled a stop signal has its default effect
// (the process ends, as an uncaught signal would end it).
void start_signal_thread();

// From now on a stop signal only requests a stop (stop_requested()), which
// the caller honours at a safe point: `apiary train` finishes the step (or
// the evaluation batch, dropping that evaluation) and saves a checkpoint.
// Further signals while a stop is pending are noted and otherwise ignored,
// so that the checkpoint is never cut short by a second delivery (srun and
// mpirun may forward the same signal the process got).
void enable_graceful_stop();

// Unblocks the stop signals in the calling thread: before exec'ing another
// program (the mask survives exec; mpirun must see its signals).
void unblock_stop_signals();

bool stop_requested();
// The first stop signal received (0: none).
int stop_signal();
// Requests a stop as a signal would (tests, health checks).
void request_stop(int signal_number);

}  // namespace apiary::core
