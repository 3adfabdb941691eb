#pragma once
// NCCL's bootstrap, kept apart from NCCL so that it runs and is tested on
// any machine: rank 0 of a group makes the communicator's unique id
// (ncclGetUniqueId in production) and every rank receives it over a host
// process group (MPI across processes, threads in tests) before any rank
// calls ncclCommInitRank. If rank 0 cannot make the id (no GPU, no network
// interface NCCL accepts), every rank gets a CommError saying so, instead of
// waiting for an id that never comes.

#include <array>
#include <cstdint>
#include <functional>

#include "comm/process_group.h"

namespace apiary::comm {

constexpr size_t kNcclIdBytes = 128;  // sizeof(ncclUniqueId)
using NcclId = std::array<uint8_t, kNcclIdBytes>;

// Collective over `boot`: calls make() on rank 0 only and returns its id on
// every rank. An exception from make() on rank 0 is rethrown there and
// becomes a CommError naming rank 0 and its message on every other rank.
NcclId exchange_nccl_id(ProcessGroup& boot, const std::function<NcclId()>& make);

}  // namespace apiary::comm
