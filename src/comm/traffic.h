#pragma once
// Bytes moved by each kind of call, counted process-wide since start (for
// the per-rank metrics), and what one call moves. "Bytes" are the caller's
// buffer: all_reduce and broadcast count the buffer, reduce_scatter its
// whole input, all_gather its whole output, all_to_all (and all_to_all_v) the send buffer,
// send / recv the message. The algorithm may put more or fewer on the wire
// (a ring all-reduce sends about twice the buffer).

#include <array>
#include <cstdint>

#include "comm/types.h"

namespace apiary::comm {

inline constexpr int kNumCollOps = int(CollOp::split) + 1;

// The bytes of one call between group_size ranks.
int64_t message_bytes(const Fingerprint& fp, int group_size);
// Adds a call to the counters (a relaxed atomic add: a few ns).
void count_traffic(CollOp op, int64_t bytes);
// Adds bytes only (all_to_all_v, whose fingerprint carries no count: the
// call itself is counted where it runs).
void count_traffic_bytes(CollOp op, int64_t bytes);
// Bytes per op since start, indexed by CollOp; and the number of calls.
std::array<uint64_t, kNumCollOps> traffic_bytes();
std::array<uint64_t, kNumCollOps> traffic_calls();

}  // namespace apiary::comm
