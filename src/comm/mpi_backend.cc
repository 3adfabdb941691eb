#include "comm/mpi_backend.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <new>

#include "comm/mpi_internal.h"
#include "comm/traffic.h"
#include "core/error.h"

namespace apiary::comm {

using detail::as_int;
using detail::CallContext;
using detail::mpi_check;
using detail::MpiGroupState;
using detail::MpiWork;

namespace {

MPI_Datatype mpi_type(DType dt) {
    switch (dt) {
        case DType::f32:
            return MPI_FLOAT;
        case DType::i64:
            return MPI_INT64_T;
        case DType::f64:
            return MPI_DOUBLE;
        default:
            return MPI_UINT16_T;
    }
}

// The MPI tag of a point-to-point message (process_group.h).
int mpi_tag(const Tag& tag) { return tag.id < 0 ? 0 : int(tag.id % 32768); }

// Work whose MPI request was started on the caller's thread (send/recv).
class RequestWork : public Work {
  public:
    RequestWork(Fingerprint fp, MPI_Request req, std::string context)
        : Work(fp), req_(req), context_(std::move(context)) {}
    ~RequestWork() override {
        if (req_ != MPI_REQUEST_NULL) MPI_Wait(&req_, MPI_STATUS_IGNORE);
    }
    bool test() override {
        int flag = 0;
        mpi_check(MPI_Test(&req_, &flag, MPI_STATUS_IGNORE), "MPI_Test", context_);
        return flag != 0;
    }
    void wait() override { mpi_check(MPI_Wait(&req_, MPI_STATUS_IGNORE), "MPI_Wait", context_); }

  private:
    MPI_Request req_;
    std::string context_;
};

class MpiGroup : public ProcessGroup {
  public:
    explicit MpiGroup(std::shared_ptr<MpiGroupState> e)
        : ProcessGroup(e->rank, e->size, e->name, e->world_ranks), e_(std::move(e)) {}
    ~MpiGroup() override { e_->shutdown(); }

    MpiGroupState& state() { return *e_; }

    WorkHandle all_reduce(void* buf, int64_t count, DType dt, ReduceOp op, Tag tag) override {
        check_reducible(dt, op);
        if (small_path(dt, op)) {
            // Small messages of their own types or op: MPI's own all-reduce.
            const int n = as_int(count, *e_, "all_reduce");
            return submit({CollOp::all_reduce, dt, count, tag}, [e = e_.get(), buf, n, dt,
                                                                 op](const CallContext& ctx) {
                if (dt == DType::bf16) {
                    float* w = e->scratch.ensure_as<float>(size_t(n));
                    bf16_to_f32(static_cast<const uint16_t*>(buf), w, n);
                    mpi_check(MPI_Allreduce(MPI_IN_PLACE, w, n, MPI_FLOAT, MPI_MAX, e->comm),
                              "MPI_Allreduce", ctx);
                    f32_to_bf16(w, static_cast<uint16_t*>(buf), n);
                    return;
                }
                mpi_check(MPI_Allreduce(MPI_IN_PLACE, buf, n, mpi_type(dt),
                                        op == ReduceOp::max ? MPI_MAX : MPI_SUM, e->comm),
                          "MPI_Allreduce", ctx);
                if (op == ReduceOp::avg) {
                    double* d = static_cast<double*>(buf);
                    for (int i = 0; i < n; ++i) d[i] /= double(e->size);
                }
            });
        }
        return submit({CollOp::all_reduce, dt, count, tag},
                      [e = e_.get(), buf, count, dt, op](const CallContext& ctx) {
                          float* data = static_cast<float*>(buf);
                          if (dt == DType::bf16) {
                              data = e->scratch.ensure_as<float>(size_t(count));
                              bf16_to_f32(static_cast<const uint16_t*>(buf), data, count);
                          }
                          all_reduce_f32(*e, data, count, ctx);
                          if (op == ReduceOp::avg) scale_f32(data, count, 1.0f / float(e->size));
                          if (dt == DType::bf16)
                              f32_to_bf16(data, static_cast<uint16_t*>(buf), count);
                      });
    }

    WorkHandle reduce_scatter(const void* send, void* recv, int64_t recv_count, DType dt,
                              ReduceOp op, Tag tag) override {
        check_reducible(dt, op, false);
        const int n = as_int(recv_count, *e_, "reduce_scatter");
        as_int(recv_count * size(), *e_, "reduce_scatter");
        return submit({CollOp::reduce_scatter, dt, recv_count, tag},
                      [e = e_.get(), send, recv, n, dt, op](const CallContext& ctx) {
                          detail::reduce_scatter(*e, send, recv, n, dt, op, ctx);
                      });
    }

    WorkHandle all_gather(const void* send, void* recv, int64_t send_count, DType dt,
                          Tag tag) override {
        const int n = as_int(send_count, *e_, "all_gather");
        as_int(send_count * size(), *e_, "all_gather");
        return submit({CollOp::all_gather, dt, send_count, tag},
                      [e = e_.get(), send, recv, n, dt](const CallContext& ctx) {
                          const size_t block = size_t(n) * core::dtype_size(dt);
                          const bool in_place = static_cast<const char*>(send) ==
                                                static_cast<char*>(recv) + block * size_t(e->rank);
                          mpi_check(MPI_Allgather(in_place ? MPI_IN_PLACE : send, n, mpi_type(dt),
                                                  recv, n, mpi_type(dt), e->comm),
                                    "MPI_Allgather", ctx);
                      });
    }

    WorkHandle broadcast(void* buf, int64_t count, DType dt, int root, Tag tag) override {
        check_peer(root);
        const int n = as_int(count, *e_, "broadcast");
        return submit({CollOp::broadcast, dt, count, tag, root}, [e = e_.get(), buf, n, dt,
                                                                  root](const CallContext& ctx) {
            mpi_check(MPI_Bcast(buf, n, mpi_type(dt), root, e->comm), "MPI_Bcast", ctx);
        });
    }

    WorkHandle all_to_all(const void* send, void* recv, int64_t count, DType dt, Tag tag) override {
        const int n = as_int(count, *e_, "all_to_all");
        as_int(count * size(), *e_, "all_to_all");
        return submit({CollOp::all_to_all, dt, count, tag}, [e = e_.get(), send, recv, n,
                                                             dt](const CallContext& ctx) {
            mpi_check(MPI_Alltoall(send, n, mpi_type(dt), recv, n, mpi_type(dt), e->comm),
                      "MPI_Alltoall", ctx);
        });
    }

    WorkHandle all_to_all_v(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                            const std::vector<int64_t>& recv_counts, DType dt,
                            Tag tag) override {
        check_counts(send_counts, recv_counts);
        // Counts and displacements as MPI's ints, copied for the worker.
        const size_t n = static_cast<size_t>(size());
        std::vector<int> sc(n), sd(n), rc(n), rd(n);
        int64_t so = 0, ro = 0;
        for (size_t r = 0; r < sc.size(); ++r) {
            sc[r] = as_int(send_counts[r], *e_, "all_to_all_v");
            rc[r] = as_int(recv_counts[r], *e_, "all_to_all_v");
            sd[r] = as_int(so, *e_, "all_to_all_v");
            rd[r] = as_int(ro, *e_, "all_to_all_v");
            so += send_counts[r];
            ro += recv_counts[r];
        }
        // The fingerprint's count is 0 (the counts differ by rank): the
        // bytes this rank sends are counted here, the call where it runs.
        count_traffic_bytes(CollOp::all_to_all_v, so * int64_t(core::dtype_size(dt)));
        return submit({CollOp::all_to_all_v, dt, 0, tag},
                      [e = e_.get(), send, recv, dt, sc = std::move(sc), sd = std::move(sd),
                       rc = std::move(rc), rd = std::move(rd)](const CallContext& ctx) {
                          mpi_check(MPI_Alltoallv(send, sc.data(), sd.data(), mpi_type(dt), recv,
                                                  rc.data(), rd.data(), mpi_type(dt), e->comm),
                                    "MPI_Alltoallv", ctx);
                      });
    }

    WorkHandle send(const void* buf, int64_t count, DType dt, int dst, Tag tag) override {
        check_peer(dst);
        Fingerprint fp{CollOp::send, dt, count, tag, dst, e_->p2p_seq++};
        count_traffic(CollOp::send, message_bytes(fp, size()));
        const std::string ctx = e_->name + " " + fp.describe();
        MPI_Request req;
        mpi_check(MPI_Isend(buf, as_int(count, *e_, "send"), mpi_type(dt), dst, mpi_tag(tag),
                            e_->comm, &req),
                  "MPI_Isend", ctx);
        return std::make_shared<RequestWork>(fp, req, ctx);
    }

    WorkHandle recv(void* buf, int64_t count, DType dt, int src, Tag tag) override {
        check_peer(src);
        Fingerprint fp{CollOp::recv, dt, count, tag, src, e_->p2p_seq++};
        count_traffic(CollOp::recv, message_bytes(fp, size()));
        const std::string ctx = e_->name + " " + fp.describe();
        MPI_Request req;
        mpi_check(MPI_Irecv(buf, as_int(count, *e_, "recv"), mpi_type(dt), src, mpi_tag(tag),
                            e_->comm, &req),
                  "MPI_Irecv", ctx);
        return std::make_shared<RequestWork>(fp, req, ctx);
    }

    WorkHandle barrier(Tag tag) override {
        return submit({CollOp::barrier, DType::f32, 0, tag},
                      [e = e_.get()](const CallContext& ctx) {
                          mpi_check(MPI_Barrier(e->comm), "MPI_Barrier", ctx);
                      });
    }

    std::shared_ptr<ProcessGroup> split(int color, int key, const std::string& name) override {
        MPI_Comm child = MPI_COMM_NULL;
        submit({CollOp::split, DType::f32, 0, Tag{}}, [e = e_.get(), color, key,
                                                       &child](const CallContext& ctx) {
            mpi_check(MPI_Comm_split(e->comm, color < 0 ? MPI_UNDEFINED : color, key, &child),
                      "MPI_Comm_split", ctx);
        })->wait();
        if (child == MPI_COMM_NULL) return nullptr;
        auto group =
            std::make_shared<MpiGroup>(std::make_shared<MpiGroupState>(child, name, e_->options));
        if (e_->options.hierarchical) set_hierarchical(*group, true, e_->options.nodes_hint);
        return group;
    }

    void reserve_scratch(CollOp op, int64_t count, DType dt) override {
        const detail::ScratchNeed need = detail::scratch_need(*e_, op, count, dt);
        // The scratch belongs to whoever executes: no call may run meanwhile.
        e_->run_exclusive([e = e_.get(), need] {
            e->scratch.ensure(need.scratch);
            e->ring.ensure(need.ring);
            e->shard.ensure(need.shard);
        });
    }

  private:
    template <class Fn>
    WorkHandle submit(Fingerprint fp, Fn fn) {
        using W = detail::MpiWorkFn<Fn>;
        void* block = detail::work_block_allocate(sizeof(W));
        W* w = new (block) W(fp, e_.get(), std::move(fn));
        // The group state's queue holds w without a reference (MpiWork::release).
        WorkHandle handle(static_cast<Work*>(w), &MpiWork::release, detail::WorkAllocator<Work>{});
        e_->enqueue(w);
        return handle;
    }

    std::shared_ptr<MpiGroupState> e_;
};

}  // namespace

void set_hierarchical(ProcessGroup& group, bool enable, int nodes_hint) {
    auto* g = dynamic_cast<MpiGroup*>(&group);
    if (!g) throw CommError(group.name() + ": hierarchical all-reduce needs the MPI backend");
    MpiGroupState& e = g->state();
    if (!enable) {
        group.barrier(Tag{"set_hierarchical", 0})->wait();  // no all_reduce in flight
        e.hierarchical = false;
        return;
    }
    group.barrier(Tag{"set_hierarchical", 1})->wait();
    if (e.local == MPI_COMM_NULL) {
        const std::string ctx = e.name + ": building node communicators";
        if (nodes_hint > 0) {
            if (e.size % nodes_hint != 0) {
                throw ConfigError(
                    fmt::format("comm.nodes_hint: {} ranks in {} do not split into {} equal nodes",
                                e.size, e.name, nodes_hint));
            }
            const int per_node = e.size / nodes_hint;
            mpi_check(MPI_Comm_split(e.comm, e.rank / per_node, e.rank, &e.local), "MPI_Comm_split",
                      ctx);
        } else {
            mpi_check(
                MPI_Comm_split_type(e.comm, MPI_COMM_TYPE_SHARED, e.rank, MPI_INFO_NULL, &e.local),
                "MPI_Comm_split_type", ctx);
        }
        int lrank = 0, lsize = 0;
        MPI_Comm_rank(e.local, &lrank);
        MPI_Comm_size(e.local, &lsize);
        int range[2] = {lsize, -lsize};
        MPI_Allreduce(MPI_IN_PLACE, range, 2, MPI_INT, MPI_MAX, e.comm);
        if (range[0] != -range[1]) {
            throw ConfigError(fmt::format(
                "comm.hierarchical: the nodes of {} hold between {} and {} ranks; hierarchical "
                "all-reduce needs the same number of ranks on every node",
                e.name, -range[1], range[0]));
        }
        mpi_check(MPI_Comm_split(e.comm, lrank, e.rank, &e.cross), "MPI_Comm_split", ctx);
        MPI_Comm_set_errhandler(e.local, MPI_ERRORS_RETURN);
        MPI_Comm_set_errhandler(e.cross, MPI_ERRORS_RETURN);
    }
    e.hierarchical = true;
}

MPI_Comm mpi_comm_of(ProcessGroup& group) {
    auto* g = dynamic_cast<MpiGroup*>(&group);
    if (!g) throw CommError(group.name() + " is not an MPI group");
    return g->state().comm;
}

bool launched_by_mpi() {
    return std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") ||
           std::getenv("PMIX_RANK") || std::getenv("SLURM_PROCID");
}

int launch_rank() {
    for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"}) {
        if (const char* v = std::getenv(var)) return std::atoi(v);
    }
    return -1;
}

void abort_mpi(int code) {
    int inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (inited && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
}

MpiSession::MpiSession(const CommOptions& options)
    : uncaught_at_start_(std::uncaught_exceptions()) {
    int inited = 0, provided = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
        owns_mpi_ = true;
    } else {
        MPI_Query_thread(&provided);
    }
    if (provided < MPI_THREAD_MULTIPLE) {
        throw CommError(fmt::format(
            "the MPI library gives thread level {}, apiary needs MPI_THREAD_MULTIPLE (OpenMPI "
            "from Debian has it; check `ompi_info | grep THREAD_MULTIPLE`)",
            provided));
    }
    detail::set_watchdog(new detail::Watchdog(options.timeout_s));
    MPI_Comm comm;
    MPI_Comm_dup(MPI_COMM_WORLD, &comm);
    world_ = std::make_shared<MpiGroup>(std::make_shared<MpiGroupState>(comm, "world", options));
    if (options.hierarchical) set_hierarchical(*world_, true, options.nodes_hint);
}

MpiSession::~MpiSession() {
    if (std::uncaught_exceptions() > uncaught_at_start_) {
        // An error is on its way to cli/main.cc, which prints it and aborts
        // every rank through the abort hook. The finalize barrier or
        // MPI_Finalize here would wait for peers that are not coming, and
        // would bury this rank's message under a watchdog report.
        world_.reset();
        return;
    }
    try {
        // Watched and checked like any collective: a rank that skipped a call
        // meets its peers here, and the watchdog names it instead of MPI_Finalize hanging.
        world_->barrier(Tag{"finalize", 0})->wait();
    } catch (const std::exception& e) {
        std::fprintf(stderr, "apiary: error: %s\n", e.what());
        abort_mpi(1);
    }
    world_.reset();
    delete detail::watchdog();
    detail::set_watchdog(nullptr);
    if (owns_mpi_) MPI_Finalize();
}

}  // namespace apiary::comm
