// The MPI backend's group state (MpiGroupState): the per-group queue of calls, who executes them
// (the worker thread or a waiting caller), and the match check.
//
// The issue-then-wait path of a small collective is the one to keep cheap: a
// 1 KiB all-reduce between two ranks on one machine takes about half a
// microsecond, so every atomic operation (a few nanoseconds each) shows. On
// that path a call costs one allocation, a spin lock taken twice, two
// reference-count updates and the monitor's lock-free bookkeeping.

#include <fmt/format.h>

#include <cstdlib>
#include <exception>
#include <new>

#include "comm/mpi_internal.h"
#include "comm/traffic.h"
#include "core/error.h"
#include "core/trace.h"

namespace apiary::comm::detail {

std::string CallContext::str() const {
    return fmt::format("{} (rank {}) {}", group->name, group->rank, fp->describe());
}

void mpi_check(int rc, const char* what, const CallContext& context) {
    if (rc != MPI_SUCCESS) mpi_check(rc, what, context.str());
}

void mpi_check(int rc, const char* what, const std::string& context) {
    if (rc == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, text, &len);
    int error_class = 0;
    MPI_Error_class(rc, &error_class);
    // Between two sampled match checks a count mismatch reaches MPI, which
    // reports it as truncation on the rank that receives too much.
    const char* hint =
        error_class == MPI_ERR_TRUNCATE
            ? " (in a collective this usually means the ranks passed different counts; "
              "comm.verify_every = 1 checks every call before it runs)"
            : "";
    throw CommError(
        fmt::format("{}: {} failed: {}{}", context, what, std::string(text, size_t(len)), hint));
}

namespace {

constexpr size_t kWorkBlock = 256;
constexpr int kMaxFreeBlocks = 64;

struct FreeList {
    void* head = nullptr;
    int size = 0;
    ~FreeList() {
        while (head) {
            void* next = *static_cast<void**>(head);
            std::free(head);
            head = next;
        }
    }
};
thread_local FreeList t_free;

}  // namespace

void* work_block_allocate(size_t bytes) {
    if (bytes > kWorkBlock) return ::operator new(bytes);
    if (void* p = t_free.head) {
        t_free.head = *static_cast<void**>(p);
        --t_free.size;
        return p;
    }
    void* p = std::malloc(kWorkBlock);
    if (!p) throw std::bad_alloc();
    return p;
}

void work_block_free(void* p, size_t bytes) noexcept {
    if (bytes > kWorkBlock) {
        ::operator delete(p);
        return;
    }
    if (t_free.size >= kMaxFreeBlocks) {
        std::free(p);
        return;
    }
    *static_cast<void**>(p) = t_free.head;
    t_free.head = p;
    ++t_free.size;
}

namespace {

// The history each rank keeps must reach back to the last match check, so
// that the calls a failed check covers can be compared (forensics.h).
size_t history_for(const CommOptions& o) { return o.verify ? size_t(o.verify_every) : 0; }

}  // namespace

MpiGroupState::MpiGroupState(MPI_Comm c, std::string n, const CommOptions& o)
    : comm(c), name(std::move(n)), options(o) {
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    int me = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    world_ranks.resize(size_t(size));
    MPI_Allgather(&me, 1, MPI_INT, world_ranks.data(), 1, MPI_INT, comm);
    // Every member of a group on several hosts sees fewer members on its own.
    MPI_Comm local;
    if (MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &local) ==
        MPI_SUCCESS) {
        int local_size = size;
        MPI_Comm_size(local, &local_size);
        MPI_Comm_free(&local);
        spans_hosts = local_size < size;
    }
    monitor = std::make_shared<GroupMonitor>(name, world_ranks, me, history_for(options));
    if (auto* w = watchdog()) w->watch(monitor);
    worker = std::thread([this] { worker_loop(); });
}

MpiGroupState::~MpiGroupState() { shutdown(); }

void MpiGroupState::shutdown() {
    {
        std::lock_guard guard(lock);
        stop = true;
    }
    wake_worker();
    if (worker.joinable()) worker.join();
}

namespace {
constexpr auto kPoll = std::chrono::microseconds(500);
// While a caller runs a call the worker is not needed unless more is queued
// (then it is woken); it still looks now and then, for a call issued by
// another thread meanwhile.
constexpr auto kBusyPoll = std::chrono::milliseconds(2);
constexpr auto kWarm = std::chrono::milliseconds(200);
}  // namespace

void MpiGroupState::wake_worker() {
    {
        std::lock_guard guard(wake_mu);
        wake_pending = true;
    }
    wake_cv.notify_one();
}

void MpiGroupState::enqueue(MpiWork* w) {
    bool wake = false;
    {
        std::lock_guard guard(lock);
        if (stop)
            throw CommError(fmt::format("{}: {} after the MPI session ended", name,
                                        w->fingerprint().describe()));
        wake = worker_cold || !queue.empty();
        w->set_seq(seq++);
        w->state.store(MpiWork::kQueued, std::memory_order_relaxed);
        queue.push_back(w);
        queued.store(queue.size(), std::memory_order_relaxed);
    }
    if (wake) wake_worker();
}

bool run_front(MpiGroupState& e, std::unique_lock<SpinLock>& lock, const MpiWork* own) {
    MpiWork* next = e.queue.front();
    e.queue.pop_front();
    e.queued.store(e.queue.size(), std::memory_order_relaxed);
    e.busy.store(true, std::memory_order_relaxed);
    lock.unlock();
    e.execute(*next, next == own);
    e.busy.store(false, std::memory_order_release);
    // Read without the lock: a call queued by another thread meanwhile may be
    // missed here, and then waits for the worker's next look (kPoll).
    return e.queued.load(std::memory_order_relaxed) > 0;
}

void MpiGroupState::worker_loop() {
    core::trace::set_thread_name("comm " + name);
    uint64_t seen_seq = 0;
    auto last_activity = Clock::now();
    std::unique_lock guard(lock);
    while (true) {
        const bool running = busy.load(std::memory_order_acquire);
        if (!running && !queue.empty()) {
            run_front(*this, guard);
            last_activity = Clock::now();
            guard.lock();
            continue;
        }
        if (stop && !running) return;
        if (seq != seen_seq) {
            seen_seq = seq;
            last_activity = Clock::now();
        }
        const bool cold = !running && Clock::now() - last_activity >= kWarm;
        worker_cold = cold;
        const auto poll = running ? std::chrono::microseconds(kBusyPoll) : kPoll;
        guard.unlock();
        {
            std::unique_lock w(wake_mu);
            if (cold)
                wake_cv.wait(w, [&] { return wake_pending; });
            else
                wake_cv.wait_for(w, poll, [&] { return wake_pending; });
            wake_pending = false;
        }
        guard.lock();
        worker_cold = false;
    }
}

void MpiGroupState::wait_for(MpiWork& w) {
    std::unique_lock guard(lock, std::defer_lock);
    while (true) {
        int s = w.state.load(std::memory_order_acquire);
        if (s >= MpiWork::kDone) return;
        guard.lock();
        if (!busy.load(std::memory_order_acquire) && !queue.empty()) {
            // The worker has not started: run the queue up to our call here.
            const bool more = run_front(*this, guard, &w);
            if (more && w.state.load(std::memory_order_acquire) >= MpiWork::kDone) wake_worker();
            continue;
        }
        guard.unlock();
        // Another thread runs a call, ours or one before it; the worker, or
        // whoever finishes a call with more queued, runs ours. wait() returns
        // at once if a call has ended since `seen` was read.
        const uint32_t seen = ended.load(std::memory_order_acquire);
        if (w.state.load(std::memory_order_acquire) >= MpiWork::kDone) return;
        ended.wait(seen, std::memory_order_acquire);
    }
}

void MpiGroupState::run_exclusive(const std::function<void()>& fn) {
    std::unique_lock guard(lock);
    while (busy.load(std::memory_order_acquire) || !queue.empty()) {
        if (!busy.load(std::memory_order_acquire)) {
            run_front(*this, guard);
        } else {
            guard.unlock();
            std::this_thread::sleep_for(std::chrono::microseconds(50));
        }
        guard.lock();
    }
    busy.store(true, std::memory_order_relaxed);
    guard.unlock();
    try {
        fn();
    } catch (...) {
        busy.store(false, std::memory_order_release);
        if (queued.load(std::memory_order_relaxed) > 0) wake_worker();
        throw;
    }
    busy.store(false, std::memory_order_release);
    if (queued.load(std::memory_order_relaxed) > 0) wake_worker();
}

namespace {

// Whether call #seq is checked before it runs: the first verify_first calls
// of the group, then every verify_every-th. A function of seq alone, which
// every rank counts alike, so every rank takes part in the same checks even
// when their calls differ (a check on one rank facing a data call on another
// would itself be a mismatch MPI cannot survive).
bool check_due(const CommOptions& o, uint64_t seq) {
    return seq < uint64_t(o.verify_first) || seq % uint64_t(o.verify_every) == 0;
}

// The match check: every rank contributes the chain hash of all its calls so
// far and its negation, so one MPI_MAX all-reduce yields the maximum and
// minimum. They agree only if every rank made the same calls up to here.
void verify_match(MpiGroupState& e, const Fingerprint& fp) {
    const uint64_t h = e.chain;
    long long v[4] = {(long long)(h >> 32), (long long)(h & 0xffffffffu), -(long long)(h >> 32),
                      -(long long)(h & 0xffffffffu)};
    mpi_check(MPI_Allreduce(MPI_IN_PLACE, v, 4, MPI_LONG_LONG, MPI_MAX, e.comm),
              "MPI_Allreduce (match check)", CallContext{&e, &fp});
    if (v[0] == -v[2] && v[1] == -v[3]) return;
    // Every rank sees the same maxima, so every rank gets here and reports.
    if (auto* w = watchdog()) {
        w->raise(e.monitor->id(), Watchdog::kMismatch);
        // The watchdog ends the process once the report is out; this is the fallback.
        std::this_thread::sleep_for(std::chrono::duration<double>(30.0 + e.options.timeout_s));
    }
    throw CommError(fmt::format(
        "{}: ranks called different collectives at or before {} (the match check covers every "
        "call since the previous check)",
        e.name, fp.describe()));
}

// The algorithm a call runs (the same choices as the calls themselves).
const char* algorithm_of(const MpiGroupState& e, const Fingerprint& fp, int64_t bytes) {
    const bool bulk = fp.dtype == DType::f32 || fp.dtype == DType::bf16;
    if (fp.op == CollOp::all_reduce && bulk) {
        if (e.hierarchical.load()) return "hierarchical";
        const int64_t f32_bytes = fp.count * 4;
        return f32_bytes >= e.ring_all_reduce_from() ? "ring" : "mpi";
    }
    if (fp.op == CollOp::reduce_scatter) {
        return bytes / int64_t(core::dtype_size(fp.dtype)) * 4 >= kRingReduceScatterBytes ? "ring"
                                                                                          : "mpi";
    }
    return "mpi";
}

}  // namespace

void MpiGroupState::execute(MpiWork& w, bool held) {
    const Fingerprint& fp = w.fingerprint();
    monitor->begin(fp);
    int end = MpiWork::kDone;
    const int64_t bytes = message_bytes(fp, size);
    count_traffic(fp.op, bytes);
    try {
        if (options.verify) {
            chain = fp.chain(chain);
            if (check_due(options, fp.seq)) verify_match(*this, fp);
        }
        core::trace::Event span_proto;
        if (core::trace::on()) {
            span_proto.name = op_name(fp.op);
            span_proto.kind = core::trace::Kind::comm;
            span_proto.bytes = bytes;
            span_proto.detail = algorithm_of(*this, fp, bytes);
            span_proto.tag = fp.tag.kind;
            span_proto.id = fp.tag.id;
        }
        core::trace::Span span(span_proto);
        w.run(CallContext{this, &fp});
        monitor->end(fp);
    } catch (const std::exception& e) {
        w.error = e.what();
        end = MpiWork::kFailed;
    }
    // After this store w may be gone (its last handle may be dropped at once
    // on another thread), so nothing below touches it.
    if (held) {
        w.state.store(end, std::memory_order_release);
    } else if (w.state.exchange(end, std::memory_order_acq_rel) & MpiWork::kOrphan) {
        w.destroy();  // no handle is left: the call's end is its last use
    }
    ended.store(ended.load(std::memory_order_relaxed) + 1, std::memory_order_release);
    ended.notify_all();
}

void MpiWork::release(Work* work) noexcept {
    auto* w = static_cast<MpiWork*>(work);
    if (w->state.load(std::memory_order_acquire) >= kDone) {
        w->destroy();
        return;
    }
    // Queued or running: whoever ends it destroys it, unless it ended meanwhile.
    if (w->state.fetch_or(kOrphan, std::memory_order_acq_rel) >= kDone) w->destroy();
}

bool MpiWork::test() {
    const int s = state.load(std::memory_order_acquire);
    if (s == kFailed) throw CommError(error);
    return s == kDone;
}

void MpiWork::wait() {
    if (state.load(std::memory_order_acquire) < kDone) group_->wait_for(*this);
    if (state.load(std::memory_order_acquire) == kFailed) throw CommError(error);
}

}  // namespace apiary::comm::detail
