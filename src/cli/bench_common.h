#pragma once
// What the commands that train share: the benches' random token rows, and
// the MPI world of a command that may run under mpirun/srun (apiary train,
// bench train/parallel/obs).

#include <cstdint>
#include <memory>
#include <vector>

#include "comm/config.h"
#include "comm/mpi_backend.h"
#include "comm/process_group.h"

namespace apiary::cli {

// n_rows rows of seq + 1 random tokens below vocab (inputs, and targets
// shifted by one); a pure function of stream, so that the ranks (or rounds)
// that pass the same stream get the same rows.
std::vector<int32_t> random_token_rows(int64_t n_rows, int64_t seq, int64_t vocab, uint64_t stream);

struct MpiWorld {
    std::unique_ptr<comm::MpiSession> session;  // null when not launched by MPI
    comm::ProcessGroup* world = nullptr;        // null: one rank
};
// Under mpirun/srun (comm::launched_by_mpi()) starts this process's one MPI
// session and sets the abort hook, so that a fatal error on one rank takes
// the job down instead of leaving the others waiting in a collective;
// otherwise returns one rank, no session.
MpiWorld start_mpi_world(const comm::CommOptions& options);

// The most ranks of this MPI job on one host (MPI_COMM_TYPE_SHARED), the
// same on every rank; 1 when not launched by MPI.
int ranks_per_host();

}  // namespace apiary::cli
