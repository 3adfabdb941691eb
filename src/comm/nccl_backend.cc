// ProcessGroup over NCCL: see nccl_backend.h for the contract. Host C++ over
// NCCL and the CUDA runtime (no kernels of its own).

#include "comm/nccl_backend.h"

#include <cuda_runtime.h>
#include <fmt/format.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "comm/nccl_bootstrap.h"
#include "core/error.h"

namespace apiary::comm {

bool nccl_built() { return true; }

namespace {

using Clock = std::chrono::steady_clock;

void nccl_check(ncclResult_t r, const char* what, const std::string& group) {
    if (r != ncclSuccess) {
        throw CommError(fmt::format("NCCL {} on {} failed: {} ({}); last NCCL message: {}", what,
                                    group, ncclGetErrorString(r), int(r),
                                    ncclGetLastError(nullptr)));
    }
}

void cuda_check(cudaError_t e, const char* what, const std::string& group) {
    if (e != cudaSuccess) {
        throw CommError(fmt::format("CUDA {} for NCCL group {} failed: {} ({})", what, group,
                                    cudaGetErrorName(e), cudaGetErrorString(e)));
    }
}

ncclDataType_t nccl_type(DType dt) {
    switch (dt) {
        case DType::f32:
            return ncclFloat32;
        case DType::bf16:
            return ncclBfloat16;
        case DType::f16:
            return ncclFloat16;
        case DType::i64:
            return ncclInt64;
        case DType::f64:
            return ncclFloat64;
    }
    throw CommError("NCCL: unknown dtype");
}

ncclRedOp_t nccl_op(ReduceOp op) {
    switch (op) {
        case ReduceOp::sum:
            return ncclSum;
        case ReduceOp::avg:
            return ncclAvg;
        case ReduceOp::max:
            return ncclMax;
    }
    throw CommError("NCCL: unknown reduce op");
}

// What a group and its Works share: the communicator may be aborted by the
// watchdog of any Work.
struct State {
    ncclComm_t comm = nullptr;
    cudaStream_t stream = nullptr;
    std::string name;
    double timeout_s = 300.0;
    bool aborted = false;

    void check_async() {
        if (aborted) throw CommError(fmt::format("NCCL group {} was aborted earlier", name));
        ncclResult_t async = ncclSuccess;
        nccl_check(ncclCommGetAsyncError(comm, &async), "ncclCommGetAsyncError", name);
        if (async != ncclSuccess) {
            abort();
            throw CommError(
                fmt::format("NCCL group {}: asynchronous error {} ({}); a peer failed "
                            "or the network did; the communicator is aborted",
                            name, ncclGetErrorString(async), int(async)));
        }
    }
    void abort() {
        if (!aborted && comm) ncclCommAbort(comm);
        aborted = true;
    }
};

class NcclWork final : public Work {
  public:
    NcclWork(Fingerprint fp, std::shared_ptr<State> st) : Work(fp), st_(std::move(st)) {
        cuda_check(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "event create",
                   st_->name);
        cuda_check(cudaEventRecord(event_, st_->stream), "event record", st_->name);
    }
    ~NcclWork() override { cudaEventDestroy(event_); }

    bool test() override {
        if (done_) return true;
        st_->check_async();
        const cudaError_t q = cudaEventQuery(event_);
        if (q == cudaErrorNotReady) return false;
        cuda_check(q, "event query", st_->name);
        done_ = true;
        return true;
    }
    // The watchdog: past the group's timeout the communicator is aborted, so
    // the stream (and every rank stuck with it) is released with an error.
    void wait() override {
        const auto start = Clock::now();
        while (!test()) {
            const double waited = std::chrono::duration<double>(Clock::now() - start).count();
            if (waited > st_->timeout_s) {
                st_->abort();
                throw CommError(fmt::format(
                    "NCCL watchdog: {} on {} did not complete in {:.0f} s (comm.timeout); a rank "
                    "is behind or called something else; the communicator is aborted",
                    fp_.describe(), st_->name, waited));
            }
            std::this_thread::sleep_for(std::chrono::microseconds(50));
        }
    }

  private:
    std::shared_ptr<State> st_;
    cudaEvent_t event_ = nullptr;
    bool done_ = false;
};

class NcclGroup final : public ProcessGroup {
  public:
    NcclGroup(std::shared_ptr<ProcessGroup> boot, ncclComm_t comm, cudaStream_t stream,
              const NcclOptions& o)
        : ProcessGroup(boot->rank(), boot->size(), boot->name(), boot->world_ranks()),
          boot_(std::move(boot)),
          options_(o),
          st_(std::make_shared<State>()) {
        st_->comm = comm;
        st_->stream = stream;
        st_->name = describe() + " [nccl]";
        st_->timeout_s = o.timeout_s;
        cuda_check(cudaMalloc(&barrier_buf_, sizeof(float)), "barrier buffer", st_->name);
        cuda_check(cudaMemsetAsync(barrier_buf_, 0, sizeof(float), stream), "memset", st_->name);
    }
    ~NcclGroup() override {
        cudaStreamSynchronize(st_->stream);
        cudaFree(barrier_buf_);
        if (!st_->aborted) ncclCommDestroy(st_->comm);
    }

    WorkHandle all_reduce(void* buf, int64_t count, DType dt, ReduceOp op, Tag tag) override {
        check_reducible(dt, op);
        const Fingerprint fp = next(CollOp::all_reduce, dt, count, tag);
        nccl_check(ncclAllReduce(buf, buf, size_t(count), nccl_type(dt), nccl_op(op), st_->comm,
                                 st_->stream),
                   "ncclAllReduce", st_->name);
        return done(fp);
    }
    WorkHandle reduce_scatter(const void* send, void* recv, int64_t recv_count, DType dt,
                              ReduceOp op, Tag tag) override {
        check_reducible(dt, op, false);
        const Fingerprint fp = next(CollOp::reduce_scatter, dt, recv_count, tag);
        nccl_check(ncclReduceScatter(send, recv, size_t(recv_count), nccl_type(dt), nccl_op(op),
                                     st_->comm, st_->stream),
                   "ncclReduceScatter", st_->name);
        return done(fp);
    }
    WorkHandle all_gather(const void* send, void* recv, int64_t send_count, DType dt,
                          Tag tag) override {
        const Fingerprint fp = next(CollOp::all_gather, dt, send_count, tag);
        nccl_check(
            ncclAllGather(send, recv, size_t(send_count), nccl_type(dt), st_->comm, st_->stream),
            "ncclAllGather", st_->name);
        return done(fp);
    }
    WorkHandle broadcast(void* buf, int64_t count, DType dt, int root, Tag tag) override {
        check_peer(root);
        const Fingerprint fp = next(CollOp::broadcast, dt, count, tag, root);
        nccl_check(
            ncclBroadcast(buf, buf, size_t(count), nccl_type(dt), root, st_->comm, st_->stream),
            "ncclBroadcast", st_->name);
        return done(fp);
    }
    WorkHandle all_to_all(const void* send, void* recv, int64_t count_per_rank, DType dt,
                          Tag tag) override {
        const Fingerprint fp = next(CollOp::all_to_all, dt, count_per_rank, tag);
        const size_t bytes = size_t(count_per_rank) * core::dtype_size(dt);
        nccl_check(ncclGroupStart(), "ncclGroupStart", st_->name);
        for (int r = 0; r < size(); ++r) {
            nccl_check(ncclSend(static_cast<const char*>(send) + r * bytes, size_t(count_per_rank),
                                nccl_type(dt), r, st_->comm, st_->stream),
                       "ncclSend", st_->name);
            nccl_check(ncclRecv(static_cast<char*>(recv) + r * bytes, size_t(count_per_rank),
                                nccl_type(dt), r, st_->comm, st_->stream),
                       "ncclRecv", st_->name);
        }
        nccl_check(ncclGroupEnd(), "ncclGroupEnd", st_->name);
        return done(fp);
    }
    WorkHandle send(const void* buf, int64_t count, DType dt, int dst, Tag tag) override {
        check_peer(dst);
        Fingerprint fp{CollOp::send, dt, count, tag, dst, p2p_seq_++};
        nccl_check(ncclSend(buf, size_t(count), nccl_type(dt), dst, st_->comm, st_->stream),
                   "ncclSend", st_->name);
        return done(fp);
    }
    WorkHandle recv(void* buf, int64_t count, DType dt, int src, Tag tag) override {
        check_peer(src);
        Fingerprint fp{CollOp::recv, dt, count, tag, src, p2p_seq_++};
        nccl_check(ncclRecv(buf, size_t(count), nccl_type(dt), src, st_->comm, st_->stream),
                   "ncclRecv", st_->name);
        return done(fp);
    }
    WorkHandle barrier(Tag tag) override {
        const Fingerprint fp = next(CollOp::barrier, DType::f32, 1, tag);
        nccl_check(ncclAllReduce(barrier_buf_, barrier_buf_, 1, ncclFloat32, ncclSum, st_->comm,
                                 st_->stream),
                   "ncclAllReduce (barrier)", st_->name);
        return done(fp);
    }
    std::shared_ptr<ProcessGroup> split(int color, int key, const std::string& name) override {
        auto sub_boot = boot_->split(color, key, name);
        ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
        ncclComm_t sub = nullptr;
        nccl_check(
            ncclCommSplit(st_->comm, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &sub, &config),
            "ncclCommSplit", st_->name);
        if (!sub_boot) return nullptr;
        return std::make_shared<NcclGroup>(sub_boot, sub, st_->stream, options_);
    }
    void reserve_scratch(CollOp, int64_t, DType) override {}  // NCCL owns its buffers

  private:
    // The call's fingerprint; with verify, the chain of every call so far is
    // compared across ranks on the host group first.
    Fingerprint next(CollOp op, DType dt, int64_t count, Tag tag, int peer = -1) {
        Fingerprint fp{op, dt, count, tag, peer, seq_++};
        chain_ = fp.chain(chain_);
        if (options_.verify) verify(fp);
        return fp;
    }
    void verify(const Fingerprint& fp) {
        std::vector<int64_t> chains(static_cast<size_t>(size()));
        int64_t mine = int64_t(chain_);
        boot_->all_gather(&mine, chains.data(), 1, DType::i64, Tag{"nccl_verify", 0})->wait();
        std::vector<int> differ;
        for (int r = 0; r < size(); ++r)
            if (chains[size_t(r)] != chains[0]) differ.push_back(world_ranks()[size_t(r)]);
        if (!differ.empty()) {
            throw CommError(fmt::format(
                "comm.verify: on {} the calls up to {} differ between world rank {} and world "
                "ranks {} (a rank skipped or reordered a collective)",
                st_->name, fp.describe(), world_ranks()[0], format_ranks(differ)));
        }
    }
    WorkHandle done(const Fingerprint& fp) { return std::make_shared<NcclWork>(fp, st_); }

    std::shared_ptr<ProcessGroup> boot_;
    NcclOptions options_;
    std::shared_ptr<State> st_;
    void* barrier_buf_ = nullptr;
    uint64_t seq_ = 0, p2p_seq_ = 0, chain_ = 0;
};

}  // namespace

std::shared_ptr<ProcessGroup> make_nccl_group(std::shared_ptr<ProcessGroup> boot, void* stream,
                                              const NcclOptions& options) {
    const NcclId id = exchange_nccl_id(*boot, [] {
        ncclUniqueId u;
        nccl_check(ncclGetUniqueId(&u), "ncclGetUniqueId", "rank 0");
        NcclId out;
        static_assert(sizeof(u) == kNcclIdBytes);
        std::memcpy(out.data(), &u, kNcclIdBytes);
        return out;
    });
    ncclUniqueId u;
    std::memcpy(&u, id.data(), kNcclIdBytes);
    ncclComm_t comm = nullptr;
    nccl_check(ncclCommInitRank(&comm, boot->size(), u, boot->rank()), "ncclCommInitRank",
               boot->describe());
    return std::make_shared<NcclGroup>(std::move(boot), comm, static_cast<cudaStream_t>(stream),
                                       options);
}

}  // namespace apiary::comm
