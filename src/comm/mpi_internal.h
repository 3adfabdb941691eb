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

class MpiWork;
struct Engine;

// Names the call in an error message; formatted only when there is an error,
// so that the fast path allocates nothing for it.
struct CallContext {
    const Engine* engine;
    const Fingerprint* fp;
    std::string str() const;
};
void mpi_check(int rc, const char* what, const CallContext& context);

// Everything one MPI process group owns; shared with its Work handles so a
// handle outlives nothing it points to.
struct Engine {
    Engine(MPI_Comm comm, std::string name, const CommOptions& options);
    ~Engine();

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
    std::mutex mu;
    std::condition_variable worker_cv;  // the worker sleeps here
    std::condition_variable done_cv;    // waiters sleep here
    std::deque<std::shared_ptr<MpiWork>> queue;
    bool busy = false;  // a thread is executing a call of this group
    bool stop = false;
    bool worker_cold = true;
    int waiters = 0;
    Clock::time_point last_call{};  // coarse: it only tells a warm worker from a cold one
    std::thread worker;
    uint64_t seq = 0;                  // guarded by mu
    std::atomic<uint64_t> p2p_seq{0};  // send/recv are numbered apart: peers differ

    // Used only by the thread executing a call (busy guards them).
    ScratchBuffer scratch;  // f32 copy of bf16 data
    ScratchBuffer shard;    // hierarchical: this rank's node-local shard
    ScratchBuffer ring;     // ring algorithms: two chunks in flight
    MPI_Comm local = MPI_COMM_NULL, cross = MPI_COMM_NULL;
    std::atomic<bool> hierarchical{false};

    void enqueue(const std::shared_ptr<MpiWork>& w);
    // Blocks until w is done, running queued calls in order when the worker is idle.
    void wait_for(MpiWork& w);
    void execute(MpiWork& w);
    void worker_loop();
    void shutdown();
};

// Runs the front call of e's queue with the lock released; the caller holds
// `lock` and has checked !e.busy && !e.queue.empty().
void run_front(Engine& e, std::unique_lock<std::mutex>& lock);

class MpiWork : public Work {
  public:
    MpiWork(Fingerprint fp, std::shared_ptr<Engine> engine)
        : Work(fp), engine_(std::move(engine)) {}
    bool test() override;
    void wait() override;

    enum State : int { kQueued, kRunning, kDone, kFailed };
    std::atomic<int> state{kQueued};
    std::string error;

    // Numbered under the group's lock, so threads may issue concurrently.
    void set_seq(uint64_t seq) { fp_.seq = seq; }
    // The MPI calls of this collective; run by whichever thread executes it.
    virtual void run(const CallContext& ctx) = 0;

  private:
    std::shared_ptr<Engine> engine_;
};

// The call's closure lives inside the Work: one allocation per call.
template <class Fn>
class MpiWorkFn final : public MpiWork {
  public:
    MpiWorkFn(Fingerprint fp, std::shared_ptr<Engine> engine, Fn fn)
        : MpiWork(fp, std::move(engine)), fn_(std::move(fn)) {}
    void run(const CallContext& ctx) override { fn_(ctx); }

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
int as_int(int64_t n, const Engine& e, const char* what);

// Where apiary's own ring algorithms take over from MPI's (see mpi_algorithms.cc).
constexpr int64_t kRingAllReduceBytes = int64_t(32) << 20;
constexpr int64_t kRingReduceScatterBytes = int64_t(4) << 20;

// A partition of a buffer into one chunk per rank (element offsets, lengths).
struct Chunks {
    std::vector<int64_t> off, len;
};
Chunks even_chunks(int64_t total, int n);
// Sum of chunk `rank` over all ranks into out (may alias that chunk of send;
// send is otherwise only read).
void ring_reduce_scatter(Engine& e, const float* send, float* out, const Chunks& c,
                         const CallContext& ctx);
// Chunk `rank` of data is this rank's; afterwards every chunk is.
void ring_all_gather(Engine& e, float* data, const Chunks& c, const CallContext& ctx);
// In-place f32 sum: MPI_Allreduce, the ring, or hierarchical (per e.hierarchical).
void all_reduce_f32(Engine& e, float* data, int64_t n, const CallContext& ctx);

Watchdog* watchdog();
void set_watchdog(Watchdog* w);

}  // namespace apiary::comm::detail
