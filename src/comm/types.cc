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

uint64_t Fingerprint::hash() const {
    // The tag kind takes part by content, so two binaries agree on it.
    const std::string kind = tag.kind ? tag.kind : "";
    const std::string key =
        fmt::format("{}|{}|{}|{}|{}|{}", int(op), int(dtype), count, kind, tag.id, peer);
    return XXH64(key.data(), key.size(), 0x61706961);
}

bool Fingerprint::same_call(const Fingerprint& o) const {
    const bool same_kind = (tag.kind == nullptr && o.tag.kind == nullptr) ||
                           (tag.kind && o.tag.kind && std::strcmp(tag.kind, o.tag.kind) == 0);
    return op == o.op && dtype == o.dtype && count == o.count && tag.id == o.tag.id &&
           peer == o.peer && same_kind;
}

}  // namespace apiary::comm
