#pragma once
// The MPI backend (OpenMPI on CPU).
//
// Threading choice: MPI is initialised with MPI_THREAD_MULTIPLE. Each process
// group owns one worker thread that executes its queued collectives in issue
// order with blocking MPI calls, so a collective progresses while the caller
// computes (OpenMPI's non-blocking collectives only progress inside MPI
// calls, which a compute loop does not make). A caller that waits on a call
// the worker has not started yet runs the queue itself up to that call, so
// issue-then-wait costs what a plain MPI_Allreduce costs. Two more threads
// need MPI: the per-process watchdog (on its own duplicate of the world
// communicator, the side channel, since the main ones may be blocked) and
// the workers of other groups (dp and tp collectives may run concurrently).
//
// Point-to-point send/recv are MPI_Isend/MPI_Irecv on the caller's thread;
// they are not watched by the watchdog (see docs/distributed.md).

#include <mpi.h>

#include <memory>

#include "comm/config.h"
#include "comm/process_group.h"

namespace apiary::comm {

// One per process: initialises MPI (or joins an MPI already initialised with
// MPI_THREAD_MULTIPLE), starts the watchdog, and on destruction drains every
// group, passes a final watched barrier (so a rank that skipped a collective is
// reported, not left hanging in MPI_Finalize) and finalises MPI. Destroyed by
// an exception, it does neither: the error reaches cli/main.cc, which prints
// it and aborts every rank (set cli::set_abort_hook to comm::abort_mpi).
class MpiSession {
  public:
    explicit MpiSession(const CommOptions& options);
    ~MpiSession();
    MpiSession(const MpiSession&) = delete;
    MpiSession& operator=(const MpiSession&) = delete;

    // The world group (a duplicate of MPI_COMM_WORLD). comm.hierarchical
    // applies to it and to every group split from it.
    std::shared_ptr<ProcessGroup> world() const { return world_; }

  private:
    int uncaught_at_start_ = 0;
    std::shared_ptr<ProcessGroup> world_;
    bool owns_mpi_ = false;
};

// True when the process was started by mpirun/srun (more than a singleton is
// possible), from the launcher's environment; MpiSession also works without.
bool launched_by_mpi();
// This process's rank as the launcher set it in the environment (before
// MPI is initialised), or -1 when not launched as one of several ranks.
int launch_rank();

// Kills every rank of the job with `code` (for cli::set_abort_hook).
void abort_mpi(int code);

// The MPI communicator behind an MPI group (benchmarks compare against raw
// MPI on it). Throws CommError for other backends.
MPI_Comm mpi_comm_of(ProcessGroup& group);

// Switches the group's all_reduce between flat (one MPI_Allreduce) and
// hierarchical: node-local reduce-scatter, all-reduce across nodes of the
// shards, node-local all-gather. Node = shared-memory domain
// (MPI_COMM_TYPE_SHARED), or with nodes_hint > 0, `nodes_hint` equal blocks of
// consecutive group ranks. Collective on first use (it builds the node
// communicators); every rank must pass the same values. Throws ConfigError if
// the nodes hold different numbers of ranks.
void set_hierarchical(ProcessGroup& group, bool enable, int nodes_hint = 0);

}  // namespace apiary::comm
