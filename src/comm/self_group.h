#pragma once
// A process group of one rank: what every parallel axis of a one-rank run is.
// Collectives over one rank are identities (a sum of one term, a gather of
// one block), so they complete at once, copying only where the caller's
// send and receive buffers differ. There is no peer: point-to-point calls
// are refused. The engine always holds its groups and parallel parts, of
// size 1 where the layout does not split that way, instead of checking for
// absent ones (torchtitan's choice too).

#include <memory>
#include <string>

#include "comm/process_group.h"

namespace apiary::comm {

class SelfGroup : public ProcessGroup {
  public:
    explicit SelfGroup(std::string name = "self", int world_rank = 0)
        : ProcessGroup(0, 1, std::move(name), {world_rank}) {}

    WorkHandle all_reduce(void* buf, int64_t count, DType dtype, ReduceOp op,
                          Tag tag = {}) override;
    WorkHandle reduce_scatter(const void* send, void* recv, int64_t recv_count, DType dtype,
                              ReduceOp op, Tag tag = {}) override;
    WorkHandle all_gather(const void* send, void* recv, int64_t send_count, DType dtype,
                          Tag tag = {}) override;
    WorkHandle broadcast(void* buf, int64_t count, DType dtype, int root, Tag tag = {}) override;
    WorkHandle all_to_all(const void* send, void* recv, int64_t count_per_rank, DType dtype,
                          Tag tag = {}) override;
    WorkHandle all_to_all_v(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                            const std::vector<int64_t>& recv_counts, DType dtype,
                            Tag tag = {}) override;
    WorkHandle send(const void* buf, int64_t count, DType dtype, int dst, Tag tag = {}) override;
    WorkHandle recv(void* buf, int64_t count, DType dtype, int src, Tag tag = {}) override;
    WorkHandle barrier(Tag tag = {}) override;
    std::shared_ptr<ProcessGroup> split(int color, int key, const std::string& name) override;
    void reserve_scratch(CollOp, int64_t, DType) override {}

  private:
    WorkHandle done(CollOp op, DType dtype, int64_t count, Tag tag, int peer = -1);
    uint64_t seq_ = 0;
};

}  // namespace apiary::comm
