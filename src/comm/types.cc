#include "comm/types.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <cstring>

namespace apiary::comm {

const char* op_name(CollOp op) {
    switch (op) {
        case CollOp::all_reduce:
            return "all_reduce";
        case CollOp::reduce_scatter:
            return "reduce_scatter";
        case CollOp::all_gather:
            return "all_gather";
        case CollOp::broadcast:
            return "broadcast";
        case CollOp::all_to_all:
            return "all_to_all";
        case CollOp::all_to_all_v:
            return "all_to_all_v";
        case CollOp::send:
            return "send";
        case CollOp::recv:
            return "recv";
        case CollOp::barrier:
            return "barrier";
        case CollOp::split:
            return "split";
    }
    return "?";
}

const char* reduce_name(ReduceOp op) {
    switch (op) {
        case ReduceOp::sum:
            return "sum";
        case ReduceOp::avg:
            return "avg";
        case ReduceOp::max:
            return "max";
    }
    return "?";
}

std::string Fingerprint::describe() const {
    std::string s = fmt::format("{} #{}", op_name(op), seq);
    if (tag.kind != nullptr || tag.id >= 0) {
        s += fmt::format(" {} {}", tag.kind ? tag.kind : "tag", tag.id);
    }
    if (op == CollOp::send || op == CollOp::recv) {
        s += fmt::format(" {} rank {}", op == CollOp::send ? "to" : "from", peer);
    } else if (op == CollOp::broadcast) {
        s += fmt::format(" root {}", peer);
    }
    if (op != CollOp::barrier && op != CollOp::split) {
        s += fmt::format(" ({} x {})", core::dtype_name(dtype), count);
    }
    return s;
}

namespace {

// A 64-bit mix (the xxh64 / murmur finalizer family): the match check
// guards against mistakes, not adversaries, so a multiply and a few shifts
// per word are enough.
inline uint64_t mix(uint64_t h, uint64_t v) {
    h ^= v * 0x9E3779B97F4A7C15ull;
    h = (h << 31 | h >> 33) * 0xC2B2AE3D27D4EB4Full;
    return h ^ (h >> 29);
}

// The hash of a tag kind's text. Kinds are string literals, so the last one
// seen per thread is almost always the next one too.
uint64_t kind_hash(const char* kind) {
    if (!kind) return 0;
    thread_local const char* last = nullptr;
    thread_local uint64_t last_hash = 0;
    if (kind != last) {
        last_hash = XXH3_64bits(kind, std::strlen(kind));
        last = kind;
    }
    return last_hash;
}

}  // namespace

uint64_t Fingerprint::hash() const {
    // Runs on every collective (the match check chains it): no formatting,
    // no allocation, two independent multiplies and one mix. The tag kind
    // takes part by content, so two binaries (or two address-space layouts)
    // agree on it.
    const uint64_t a = kind_hash(tag.kind) ^ (uint64_t(count) * 0x9E3779B97F4A7C15ull);
    const uint64_t b = (uint64_t(tag.id) * 0xC2B2AE3D27D4EB4Full) ^
                       ((uint64_t(uint32_t(peer)) << 16) | (uint64_t(op) << 8) | uint64_t(dtype));
    return mix(a, b);
}

uint64_t Fingerprint::chain(uint64_t previous) const { return mix(previous, hash()); }

bool Fingerprint::same_call(const Fingerprint& o) const {
    const bool same_kind = (tag.kind == nullptr && o.tag.kind == nullptr) ||
                           (tag.kind && o.tag.kind && std::strcmp(tag.kind, o.tag.kind) == 0);
    return op == o.op && dtype == o.dtype && count == o.count && tag.id == o.tag.id &&
           peer == o.peer && same_kind;
}

}  // namespace apiary::comm
