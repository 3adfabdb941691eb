#pragma once
// ProcessGroup: the collectives the trainer uses, over any backend (MPI across
// processes, threads within one process for tests, NCCL later).
//
// Contract, shared with MPI and NCCL:
//  * Every call returns at once with a Work handle; the buffers must stay
//    alive and untouched until wait() returns or test() says true.
//  * Every rank of a group issues the same calls in the same order (SPMD).
//    Each call gets the next sequence number of the group; together with the
//    op, dtype, count and caller's tag it forms the call's Fingerprint, which
//    the watchdog and the match check (comm.verify) compare across ranks.
//  * Calls of one group execute one at a time in issue order. Calls on
//    different groups may run concurrently.
//  * bf16 reductions convert to f32, reduce in f32 and round once at the end,
//    so the result does not depend on the reduction tree more than f32 does.
//  * Scratch space is allocated on first use, kept and reused (grow-only):
//    page faults on the VMs we run on cost more than the copy itself.
//    Large reduce-scatters run in pieces (kCollectivePieceBytes), so their
//    scratch is bounded by the piece, not by the message.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/types.h"

namespace apiary::comm {

// A large reduce-scatter runs as pieces of at most this many bytes of f32
// (every rank's block together): elements [a, b) of each block, then the
// next range. Each element is summed in the same order as in one call over
// the whole blocks, so the result does not change; the scratch it needs
// (bf16 input widened to f32, the ring's two chunks in flight) is bounded
// by the piece whatever the message size.
constexpr int64_t kCollectivePieceBytes = int64_t(16) << 20;

class Work {
  public:
    explicit Work(Fingerprint fp) : fp_(fp) {}
    virtual ~Work() = default;
    Work(const Work&) = delete;
    Work& operator=(const Work&) = delete;

    // True once the call has completed (never blocks for long). Throws
    // CommError if the call failed.
    virtual bool test() = 0;
    // Blocks until the call has completed. Throws CommError if it failed.
    virtual void wait() = 0;
    const Fingerprint& fingerprint() const { return fp_; }

  protected:
    Fingerprint fp_;
};
using WorkHandle = std::shared_ptr<Work>;

// Waits for every handle, in order.
void wait_all(const std::vector<WorkHandle>& works);

class ProcessGroup {
  public:
    virtual ~ProcessGroup() = default;

    int rank() const { return rank_; }
    int size() const { return size_; }
    // "world", "dp", "tp", "pp", ... (for messages).
    const std::string& name() const { return name_; }
    // World rank of every member, indexed by group rank.
    const std::vector<int>& world_ranks() const { return world_ranks_; }
    // "dp (world ranks 0,2,4)" for messages.
    std::string describe() const;

    // buf (count) is reduced across ranks in place. f32 and bf16 take every
    // op; i64 and f64 (counts, loss sums, norms) take sum and max, f64 avg
    // too. The large, bandwidth-bound calls are f32 / bf16 sums.
    virtual WorkHandle all_reduce(void* buf, int64_t count, DType dtype, ReduceOp op,
                                  Tag tag = {}) = 0;
    // send (size * recv_count) is summed (f32, bf16); rank r receives block r in recv
    // (recv_count). recv may be send's own block (send + rank * recv_count):
    // then the other blocks of send are left undefined.
    virtual WorkHandle reduce_scatter(const void* send, void* recv, int64_t recv_count, DType dtype,
                                      ReduceOp op, Tag tag = {}) = 0;
    // Every rank's send (send_count) lands at block r of recv (size * send_count).
    // send may be recv's own block (recv + rank * send_count).
    virtual WorkHandle all_gather(const void* send, void* recv, int64_t send_count, DType dtype,
                                  Tag tag = {}) = 0;
    virtual WorkHandle broadcast(void* buf, int64_t count, DType dtype, int root, Tag tag = {}) = 0;
    // Block j of send (count_per_rank) goes to rank j; block i of recv comes
    // from rank i. send and recv must not overlap.
    virtual WorkHandle all_to_all(const void* send, void* recv, int64_t count_per_rank, DType dtype,
                                  Tag tag = {}) = 0;
    // Variable counts (MPI_Alltoallv): send_counts[j] elements go to rank j,
    // recv_counts[i] come from rank i; blocks are back to back in rank order
    // in both buffers. Each rank's recv_counts[i] must equal rank i's
    // send_counts[rank] (exchange them first with all_to_all). The counts are
    // copied at the call. send and recv must not overlap. The default runs
    // over send / recv (the thread backend); MPI uses MPI_Alltoallv.
    virtual WorkHandle all_to_all_v(const void* send, const std::vector<int64_t>& send_counts,
                                    void* recv, const std::vector<int64_t>& recv_counts,
                                    DType dtype, Tag tag = {});
    // Point to point. Messages between two ranks match in order among those
    // with the same tag id (it is the MPI tag, 0-32767; -1 counts as 0), so
    // streams of different kinds between the same pair (a pipeline's
    // activations one way and gradients the other) never cross.
    virtual WorkHandle send(const void* buf, int64_t count, DType dtype, int dst, Tag tag = {}) = 0;
    virtual WorkHandle recv(void* buf, int64_t count, DType dtype, int src, Tag tag = {}) = 0;
    virtual WorkHandle barrier(Tag tag = {}) = 0;

    // Collective over this group (blocking): ranks with the same color form a
    // new group, ordered by key then by rank here. color < 0: this rank joins
    // no group and gets nullptr.
    virtual std::shared_ptr<ProcessGroup> split(int color, int key, const std::string& name) = 0;

    // Ensures now, outside the step loop, the scratch space that a call of
    // `op` over `count` elements of `dtype` needs (count as that call takes
    // it: the buffer of all_reduce, recv_count of reduce_scatter). Calls
    // that need less use the same space.
    virtual void reserve_scratch(CollOp op, int64_t count, DType dtype) = 0;

  protected:
    // Argument checks shared by the backends; each throws CommError.
    // What all_reduce (elementwise) / reduce_scatter (bulk sums) accept.
    void check_reducible(DType dt, ReduceOp op, bool elementwise = true) const;
    // The all-reduces that take the small-message path (max, i64, f64).
    static bool small_path(DType dt, ReduceOp op) {
        return op == ReduceOp::max || dt == DType::i64 || dt == DType::f64;
    }
    void check_peer(int r) const;  // 0 <= r < size()
    // One non-negative count per rank each (all_to_all_v).
    void check_counts(const std::vector<int64_t>& send_counts,
                      const std::vector<int64_t>& recv_counts) const;

    ProcessGroup(int rank, int size, std::string name, std::vector<int> world_ranks)
        : rank_(rank), size_(size), name_(std::move(name)), world_ranks_(std::move(world_ranks)) {}

  private:
    int rank_;
    int size_;
    std::string name_;
    std::vector<int> world_ranks_;
};

// Every rank must hold the same config hash (core::Config::hash()); throws
// CommError on every rank, naming the ranks whose config differs from rank 0's.
void check_config_hash(ProcessGroup& world, uint64_t hash);

// Every rank's string, indexed by rank, on every rank (collective; for small
// metadata such as checkpoint manifests and benchmark reports).
std::vector<std::string> all_gather_strings(ProcessGroup& group, const std::string& mine);

// "0-2,5,7-8": compact list of ranks for messages.
std::string format_ranks(const std::vector<int>& ranks);

}  // namespace apiary::comm
