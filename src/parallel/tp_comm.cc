#include "parallel/tp_comm.h"

#include "core/timing.h"
#include "core/trace.h"

namespace apiary::parallel {

using comm::DType;
using comm::ReduceOp;

void TpComm::wait(const comm::WorkHandle& w, double bytes) {
    const auto t0 = core::Clock::now();
    APIARY_TRACE("tp wait", core::trace::Kind::wait, -1, int64_t(bytes));
    w->wait();
    seconds_ += core::seconds_since(t0);
    bytes_ += bytes;
    ++calls_;
}

void TpComm::all_reduce_sum(float* x, int64_t n) {
    wait(group_.all_reduce(x, n, DType::f32, ReduceOp::sum, {"tp_sum", calls_}), 4.0 * double(n));
}

void TpComm::all_reduce_max(float* x, int64_t n) {
    wait(group_.all_reduce(x, n, DType::f32, ReduceOp::max, {"tp_max", calls_}), 4.0 * double(n));
}

void TpComm::all_gather_rows(const float* local, float* full, int64_t rows, int64_t cols) {
    wait(group_.all_gather(local, full, rows * cols, DType::f32, {"tp_gather", calls_}),
         4.0 * double(rows * cols * size()));
}

void TpComm::all_gather_rows_bf16(const uint16_t* local, uint16_t* full, int64_t rows,
                                  int64_t cols) {
    wait(group_.all_gather(local, full, rows * cols, DType::bf16, {"tp_gather", calls_}),
         2.0 * double(rows * cols * size()));
}

void TpComm::reduce_scatter_rows(const float* full, float* local, int64_t rows, int64_t cols) {
    wait(group_.reduce_scatter(full, local, rows * cols, DType::f32, ReduceOp::sum,
                               {"tp_scatter", calls_}),
         4.0 * double(rows * cols * size()));
}

void EpComm::all_to_all_counts(const int64_t* send, int64_t* recv, int64_t per_rank) {
    const auto t0 = core::Clock::now();
    APIARY_TRACE("ep all-to-all", core::trace::Kind::wait, -1, 8 * per_rank * size(), "counts");
    group_.all_to_all(send, recv, per_rank, DType::i64, {"ep_counts", calls_++})->wait();
    seconds_ += core::seconds_since(t0);
}

void EpComm::all_to_all_rows(const float* send, const std::vector<int64_t>& send_rows,
                             float* recv, const std::vector<int64_t>& recv_rows, int64_t cols) {
    std::vector<int64_t> sc(send_rows.size()), rc(recv_rows.size());
    int64_t sent = 0;
    for (size_t i = 0; i < sc.size(); ++i) {
        sc[i] = send_rows[i] * cols;
        if (int(i) != rank()) sent += sc[i];
    }
    for (size_t i = 0; i < rc.size(); ++i) rc[i] = recv_rows[i] * cols;
    const auto t0 = core::Clock::now();
    APIARY_TRACE("ep all-to-all", core::trace::Kind::wait, -1, 4 * sent, "rows");
    group_.all_to_all_v(send, sc, recv, rc, DType::f32, {"ep_rows", calls_++})->wait();
    seconds_ += core::seconds_since(t0);
    bytes_ += 4.0 * double(sent);
}

}  // namespace apiary::parallel
