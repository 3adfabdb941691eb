#pragma once
// Internals shared by mpi_backend.cc (groups, workers) and mpi_watchdog.cc
// (the watchdog and its side channel). Not part of the API.

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/buffer.h"
#include "comm/config.h"
#include "comm/forensics.h"
#include "comm/process_group.h"

namespace apiary::comm::detail {

// Throws CommError naming the call and MPI's own message if rc is an error.
void mpi_check(int rc, const char* what, const std::string& context);

// Where apiary's own ring algorithms take over from MPI's (see mpi_algorithms.cc).
constexpr int64_t kRingAllReduceBytes = int64_t(32) << 20;
// ... and across hosts, where MPI's own all-reduce moves about twice the ring's bytes.
constexpr int64_t kRingAllReduceAcrossHostsBytes = int64_t(1) << 20;
constexpr int64_t kRingReduceScatterBytes = int64_t(4) << 20;

class MpiWork;
struct MpiGroupState;

// Names the call in an error message; formatted only when there is an error,
// so that the fast path allocates nothing for it.
struct CallContext {
    const MpiGroupState* group;
    const Fingerprint* fp;
    std::string str() const;
};
void mpi_check(int rc, const char* what, const CallContext& context);

// A lock for a few instructions (a queue push or pop): acquiring is one
// atomic exchange and releasing a plain store, where a pthread mutex costs an
// atomic operation on each side. Spins briefly, then yields, in case the
// holder was preempted on an oversubscribed machine.
class SpinLock {
  public:
    void lock() noexcept {
        for (int spins = 0; locked_.exchange(true, std::memory_order_acquire);) {
            while (locked_.load(std::memory_order_relaxed)) {
                if (++spins < 64) {
#if defined(__x86_64__) || defined(__i386__)
                    __builtin_ia32_pause();
#endif
                } else {
                    std::this_thread::yield();
                }
            }
        }
    }
    void unlock() noexcept { locked_.store(false, std::memory_order_release); }

  private:
    std::atomic<bool> locked_{false};
};

// Everything one MPI process group owns; shared with its Work handles so a
// handle outlives nothing it points to.
struct MpiGroupState {
    MpiGroupState(MPI_Comm comm, std::string name, const CommOptions& options);
    ~MpiGroupState();

    MPI_Comm comm;
    int rank = 0, size = 1;
    std::string name;
    std::vector<int> world_ranks;
    CommOptions options;
    std::shared_ptr<GroupMonitor> monitor;

    // Who runs a call: the worker thread, or a caller that waits on a call
    // the worker has not started (it then runs the queue up to its call). To
    // keep issue-then-wait as cheap as a plain MPI call, enqueue does not wake
    // the worker while it is "warm" (it polls the queue every kPoll for a
    // while after the last call; a woken thread on a busy machine costs more
    // than the call); a cold worker, or a second queued call, is woken at once.
    // A caller waiting on a call that another thread runs sleeps on the call's
    // own state (MpiWork::state), so finishing a call wakes only its waiters.
    SpinLock lock;  // guards queue, stop, worker_cold and seq, and the claim of busy
    std::deque<MpiWork*> queue;
    std::atomic<size_t> queued{0};  // queue.size(), also readable without the lock
    // A thread is executing a call of this group. Claimed under the lock,
    // released by a plain store without it (one atomic operation less per
    // call); the data it guards below is handed over by that release.
    std::atomic<bool> busy{false};
    bool stop = false;
    bool worker_cold = true;
    uint64_t seq = 0;
    std::thread worker;
    // Waking the worker is off the fast path: a plain mutex and condition.
    std::mutex wake_mu;
    std::condition_variable wake_cv;
    bool wake_pending = false;  // guarded by wake_mu
    // Bumped (by the executing thread only) each time a call ends; callers
    // whose call another thread runs sleep on it.
    std::atomic<uint32_t> ended{0};
    std::atomic<uint64_t> p2p_seq{0};  // send/recv are numbered apart: peers differ

    // Used only by the thread executing a call (busy guards them).
    uint64_t chain = 0;     // match check: hash of every call so far, in order
    ScratchBuffer scratch;  // f32 copy of bf16 data
    ScratchBuffer shard;    // hierarchical: this rank's node-local shard
    ScratchBuffer ring;     // ring algorithms: two chunks in flight
    MPI_Comm local = MPI_COMM_NULL, cross = MPI_COMM_NULL;
    std::atomic<bool> hierarchical{false};
    bool spans_hosts = false;  // members on more than one host (MPI_COMM_TYPE_SHARED)
    // The f32 bytes from which a flat all-reduce takes apiary's ring.
    int64_t ring_all_reduce_from() const {
        return spans_hosts ? kRingAllReduceAcrossHostsBytes : kRingAllReduceBytes;
    }

    void enqueue(MpiWork* w);
    // Blocks until w is done, running queued calls in order when the worker is idle.
    void wait_for(MpiWork& w);
    // Runs fn with no call queued or running (the queue drained first), so
    // that fn may touch what executing threads own (the scratch buffers).
    void run_exclusive(const std::function<void()>& fn);
    // held: the executing thread holds a handle of w (then no other thread
    // can destroy it, and the end of the call is published without an
    // atomic read-modify-write).
    void execute(MpiWork& w, bool held);
    void worker_loop();
    void wake_worker();
    void shutdown();
};

// Runs the front call of e's queue; the caller holds `lock` and has checked
// !e.busy && !e.queue.empty(). Returns with the lock released, and whether
// more calls are queued (a caller other than the worker then wakes it).
// own: the caller's call, if it waits on one (it holds a handle of it).
bool run_front(MpiGroupState& e, std::unique_lock<SpinLock>& lock, const MpiWork* own = nullptr);

// A collective in the queue. Its lifetime is shared by the user's handles
// and the group state without a second reference count (two atomic operations a
// call): the queue holds a plain pointer, and when the last handle goes
// before the call has ended (MpiWork::release) the executing thread destroys
// the work once it ends.
class MpiWork : public Work {
  public:
    // A plain group pointer for the same reason: the group state drains its queue
    // before it goes (MpiGroupState::shutdown), so a handle that outlives it is done
    // and never touches it again.
    MpiWork(Fingerprint fp, MpiGroupState* group) : Work(fp), group_(group) {}
    bool test() override;
    void wait() override;

    // A work is created kDone ("nothing in flight", so a handle dropped
    // before the call was queued frees it) and set to kQueued when queued.
    // kOrphan is or-ed in by release() when no handle is left.
    enum State : int { kQueued = 0, kRunning = 1, kDone = 2, kFailed = 3, kOrphan = 4 };
    std::atomic<int> state{kDone};
    std::string error;

    // Numbered under the group's lock, so threads may issue concurrently.
    void set_seq(uint64_t seq) { fp_.seq = seq; }
    // The MPI calls of this collective; run by whichever thread executes it.
    virtual void run(const CallContext& ctx) = 0;
    // Runs the destructor and frees the block (the most derived type knows its size).
    virtual void destroy() noexcept = 0;
    // The deleter of the handles' shared_ptr: destroys the work now if its
    // call has ended, else marks it for the executing thread to destroy.
    static void release(Work* w) noexcept;

  private:
    MpiGroupState* group_;
};

// Work handles come and go once per call; a small per-thread free list of
// fixed-size blocks makes the allocation a few loads and stores where
// malloc and free cost about ten nanoseconds together. Blocks freed on
// another thread (the worker) join that thread's list.
void* work_block_allocate(size_t bytes);
void work_block_free(void* p, size_t bytes) noexcept;

template <class T>
struct WorkAllocator {
    using value_type = T;
    WorkAllocator() = default;
    template <class U>
    WorkAllocator(const WorkAllocator<U>&) {}
    T* allocate(size_t n) { return static_cast<T*>(work_block_allocate(n * sizeof(T))); }
    void deallocate(T* p, size_t n) noexcept { work_block_free(p, n * sizeof(T)); }
    template <class U>
    bool operator==(const WorkAllocator<U>&) const {
        return true;
    }
};

// The call's closure lives inside the Work: one allocation per call.
template <class Fn>
class MpiWorkFn final : public MpiWork {
  public:
    MpiWorkFn(Fingerprint fp, MpiGroupState* group, Fn fn)
        : MpiWork(fp, group), fn_(std::move(fn)) {}
    void run(const CallContext& ctx) override { fn_(ctx); }
    void destroy() noexcept override {
        this->~MpiWorkFn();
        work_block_free(this, sizeof(MpiWorkFn));
    }

  private:
    Fn fn_;
};

// The per-process watchdog and its side channel (a duplicate of the world
// communicator that nothing else uses, so it still works while the main
// communicators are blocked inside a collective).
class Watchdog {
  public:
    Watchdog(double timeout_s);
    ~Watchdog();
    void watch(const std::shared_ptr<GroupMonitor>& monitor);
    // Called by a rank that found a mismatch: starts the report at once.
    void raise(uint64_t group_id, int reason);
    static constexpr int kTimeout = 1, kMismatch = 2;

  private:
    void loop();
    [[noreturn]] void report(uint64_t group_id, int origin, int reason);
    MPI_Comm side_ = MPI_COMM_NULL;
    int world_rank_ = 0, world_size_ = 1;
    double timeout_s_;
    std::mutex mu_;
    std::vector<std::weak_ptr<GroupMonitor>> monitors_;
    std::atomic<bool> stop_{false};
    std::atomic<uint64_t> raised_group_{0};
    std::atomic<int> raised_reason_{0};
    std::thread thread_;
};

// ---- algorithms (mpi_algorithms.cc), run by the thread executing a call ----

// MPI counts are int: throws CommError naming the group if n does not fit.
int as_int(int64_t n, const MpiGroupState& e, const char* what);


// A partition of a buffer into one chunk per rank (element offsets, lengths).
struct Chunks {
    std::vector<int64_t> off, len;
};
Chunks even_chunks(int64_t total, int n);
// Sum of chunk `rank` over all ranks into out (may alias that chunk of send;
// send is otherwise only read).
void ring_reduce_scatter(MpiGroupState& e, const float* send, float* out, const Chunks& c,
                         const CallContext& ctx);
// Chunk `rank` of data is this rank's; afterwards every chunk is.
void ring_all_gather(MpiGroupState& e, float* data, const Chunks& c, const CallContext& ctx);
// In-place f32 sum: MPI_Allreduce, the ring, or hierarchical (per e.hierarchical).
void all_reduce_f32(MpiGroupState& e, float* data, int64_t n, const CallContext& ctx);
// Reduce-scatter (sum or avg) of f32 or bf16 blocks of n elements:
// MPI_Reduce_scatter_block for small calls, else the ring in pieces of
// piece_len(n, e.size) elements of every block (kCollectivePieceBytes).
void reduce_scatter(MpiGroupState& e, const void* send, void* recv, int64_t n, DType dt,
                    ReduceOp op, const CallContext& ctx);
int64_t piece_len(int64_t n, int size);

// Bytes of each scratch buffer that one call needs (what reserve_scratch
// allocates ahead; the calls ensure the same sizes).
struct ScratchNeed {
    size_t scratch = 0, ring = 0, shard = 0;
};
ScratchNeed scratch_need(const MpiGroupState& e, CollOp op, int64_t count, DType dt);

Watchdog* watchdog();
void set_watchdog(Watchdog* w);

}  // namespace apiary::comm::detail
