#pragma once
// Checks of every collective against closed-form values, written once and
// run on every backend (threads in test_comm, MPI ranks in test_comm_mpi).
// Inputs are small integers, so sums are exact in f32 and bf16 whatever the
// reduction order, and results can be compared with ==.

#include "comm/process_group.h"

namespace apiary::comm::testing {

void check_all_reduce(ProcessGroup& g, DType dt, ReduceOp op, int64_t count);
void check_reduce_scatter(ProcessGroup& g, DType dt, bool in_place, int64_t count);
void check_all_gather(ProcessGroup& g, DType dt, bool in_place, int64_t count);
void check_broadcast(ProcessGroup& g, int root, int64_t count);
void check_all_to_all(ProcessGroup& g, int64_t count);
// Variable counts, an empty block among them.
void check_all_to_all_v(ProcessGroup& g);
void check_send_recv_ring(ProcessGroup& g, int64_t count);
void check_many_outstanding(ProcessGroup& g);
void check_mesh(ProcessGroup& world, int dp, int tp, int pp, const char* order);

}  // namespace apiary::comm::testing
