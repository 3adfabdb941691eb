#pragma once
// Vocabulary of the communication layer: element types, reductions, the name
// of each collective, and the Fingerprint every collective carries so that a
// hang or a mismatch can be traced to the rank and the call that caused it.

#include <cstdint>
#include <string>

#include "core/tensor.h"

namespace apiary::comm {

using core::DType;

// avg is sum followed by a multiply by 1/size on every rank (exact for
// power-of-two sizes, otherwise one rounding). max is the elementwise
// maximum (the vocabulary-parallel softmax's row max).
enum class ReduceOp : uint8_t { sum, avg, max };

enum class CollOp : uint8_t {
    all_reduce,
    reduce_scatter,
    all_gather,
    broadcast,
    all_to_all,
    all_to_all_v,  // variable counts: the fingerprint's count is 0 (counts differ by rank)
    send,
    recv,
    barrier,
    split,
};
const char* op_name(CollOp op);
const char* reduce_name(ReduceOp op);

// A caller's label for one call, e.g. Tag{"bucket", 7}; it appears in every
// diagnostic and takes part in the cross-rank match check. `kind` must be a
// string literal (it is stored as a pointer).
struct Tag {
    const char* kind = nullptr;
    int64_t id = -1;
};

// What one rank believes one collective is. Two ranks that disagree on any
// field of the same sequence number have called different collectives, which
// MPI would turn into a hang or silent garbage.
struct Fingerprint {
    CollOp op = CollOp::barrier;
    DType dtype = DType::f32;
    int64_t count = 0;  // elements as passed by the caller (per rank block for rs/ag/a2a)
    Tag tag;
    int32_t peer = -1;  // root of a broadcast, peer of send/recv; -1 otherwise
    uint64_t seq = 0;   // per process group, 0-based; send/recv count separately

    // "all_reduce #1043 bucket 7 (f32 x 1048576)"
    std::string describe() const;
    // Hash of everything but seq (cheap: it runs on every call).
    uint64_t hash() const;
    // The match check's running hash after this call, from the one before it.
    uint64_t chain(uint64_t previous) const;
    bool same_call(const Fingerprint& o) const;
};

}  // namespace apiary::comm
