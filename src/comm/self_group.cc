#include "comm/self_group.h"

#include <fmt/format.h>

#include <cstring>

#include "core/error.h"

namespace apiary::comm {

namespace {

class DoneWork : public Work {
  public:
    using Work::Work;
    bool test() override { return true; }
    void wait() override {}
};

void copy_if_apart(const void* send, void* recv, int64_t count, DType dtype) {
    if (send != recv && count > 0) {
        std::memmove(recv, send, size_t(count) * core::dtype_size(dtype));
    }
}

}  // namespace

WorkHandle SelfGroup::done(CollOp op, DType dtype, int64_t count, Tag tag, int peer) {
    Fingerprint fp;
    fp.op = op;
    fp.dtype = dtype;
    fp.count = count;
    fp.tag = tag;
    fp.peer = peer;
    fp.seq = seq_++;
    return std::make_shared<DoneWork>(fp);
}

WorkHandle SelfGroup::all_reduce(void*, int64_t count, DType dtype, ReduceOp op, Tag tag) {
    check_reducible(dtype, op);
    return done(CollOp::all_reduce, dtype, count, tag);
}

WorkHandle SelfGroup::reduce_scatter(const void* send, void* recv, int64_t recv_count,
                                     DType dtype, ReduceOp op, Tag tag) {
    check_reducible(dtype, op, false);
    copy_if_apart(send, recv, recv_count, dtype);
    return done(CollOp::reduce_scatter, dtype, recv_count, tag);
}

WorkHandle SelfGroup::all_gather(const void* send, void* recv, int64_t send_count, DType dtype,
                                 Tag tag) {
    copy_if_apart(send, recv, send_count, dtype);
    return done(CollOp::all_gather, dtype, send_count, tag);
}

WorkHandle SelfGroup::broadcast(void*, int64_t count, DType dtype, int root, Tag tag) {
    check_peer(root);
    return done(CollOp::broadcast, dtype, count, tag, root);
}

WorkHandle SelfGroup::all_to_all(const void* send, void* recv, int64_t count_per_rank,
                                 DType dtype, Tag tag) {
    copy_if_apart(send, recv, count_per_rank, dtype);
    return done(CollOp::all_to_all, dtype, count_per_rank, tag);
}

WorkHandle SelfGroup::all_to_all_v(const void* send, const std::vector<int64_t>& send_counts,
                                   void* recv, const std::vector<int64_t>& recv_counts,
                                   DType dtype, Tag tag) {
    check_counts(send_counts, recv_counts);
    if (send_counts[0] != recv_counts[0]) {
        throw CommError(fmt::format("{}: all_to_all_v sends {} elements to itself but expects {}",
                                    name(), send_counts[0], recv_counts[0]));
    }
    copy_if_apart(send, recv, send_counts[0], dtype);
    return done(CollOp::all_to_all_v, dtype, 0, tag);
}

WorkHandle SelfGroup::send(const void*, int64_t, DType, int dst, Tag) {
    check_peer(dst);
    throw CommError(fmt::format("{}: a group of one rank has no peer to send to", name()));
}

WorkHandle SelfGroup::recv(void*, int64_t, DType, int src, Tag) {
    check_peer(src);
    throw CommError(fmt::format("{}: a group of one rank has no peer to receive from", name()));
}

WorkHandle SelfGroup::barrier(Tag tag) { return done(CollOp::barrier, DType::f32, 0, tag); }

std::shared_ptr<ProcessGroup> SelfGroup::split(int color, int, const std::string& name) {
    if (color < 0) return nullptr;
    return std::make_shared<SelfGroup>(name, world_ranks()[0]);
}

}  // namespace apiary::comm
