#include "cli/bench_common.h"

#include <mpi.h>

#include "cli/command.h"
#include "core/rng.h"

namespace apiary::cli {

std::vector<int32_t> random_token_rows(int64_t n_rows, int64_t seq, int64_t vocab,
                                       uint64_t stream) {
    std::vector<int32_t> rows(size_t(n_rows) * size_t(seq + 1));
    const core::Philox rng(7, stream);
    for (size_t i = 0; i < rows.size(); ++i) rows[i] = int32_t(rng.below(i, uint64_t(vocab)));
    return rows;
}

MpiWorld start_mpi_world(const comm::CommOptions& options) {
    MpiWorld w;
    if (!comm::launched_by_mpi()) return w;
    w.session = std::make_unique<comm::MpiSession>(options);
    w.world = w.session->world().get();
    set_abort_hook([](int code) { comm::abort_mpi(code); });
    return w;
}

int ranks_per_host() {
    if (!comm::launched_by_mpi()) return 1;
    MPI_Comm local;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local);
    int n = 1, most = 1;
    MPI_Comm_size(local, &n);
    MPI_Comm_free(&local);
    MPI_Allreduce(&n, &most, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    return most;
}

}  // namespace apiary::cli
