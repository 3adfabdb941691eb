#include "cli/bench_common.h"

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

}  // namespace apiary::cli
