#include "comm/thread_backend.h"

#include <fmt/format.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>
#include <vector>

#include "comm/buffer.h"
#include "comm/forensics.h"
#include "comm/traffic.h"
#include "core/error.h"
#include "core/trace.h"

namespace apiary::comm {

namespace {

size_t bytes_of(int64_t count, DType dt) { return size_t(count) * core::dtype_size(dt); }

// State shared by the member threads of one group.
struct Shared {
    struct Slot {
        const void* send = nullptr;
        void* recv = nullptr;
        Fingerprint fp;
        int color = 0, key = 0;
    };
    Shared(std::string n, std::vector<int> wr, ThreadWorldOptions o)
        : name(std::move(n)),
          world_ranks(std::move(wr)),
          options(o),
          slots(world_ranks.size()),
          monitors(world_ranks.size(), nullptr) {}

    std::string name;
    std::vector<int> world_ranks;
    ThreadWorldOptions options;
    std::mutex mu;
    std::condition_variable cv;
    std::vector<Slot> slots;
    std::vector<const GroupMonitor*> monitors;
    int arrived = 0;
    uint64_t generation = 0;
    std::string failure;  // non-empty: the group is broken
    std::map<std::tuple<int, int, int>, std::deque<std::vector<char>>> mail;  // (src, dst, tag)
    std::map<std::pair<uint64_t, int>, std::shared_ptr<Shared>> children;     // (seq, color)
};

std::string diagnose_locked(Shared& sh) {
    std::vector<GroupSnapshot> snaps;
    for (size_t r = 0; r < sh.monitors.size(); ++r) {
        if (sh.monitors[r]) {
            snaps.push_back(sh.monitors[r]->snapshot());
        } else {
            snaps.push_back(GroupSnapshot{});
            snaps.back().world_rank = sh.world_ranks[r];
            snaps.back().answered = false;
        }
    }
    return diagnose(sh.name, snaps);
}

class DoneWork : public Work {
  public:
    using Work::Work;
    bool test() override { return true; }
    void wait() override {}
};

class ThreadGroup;

class RecvWork : public Work {
  public:
    RecvWork(Fingerprint fp, std::shared_ptr<Shared> sh, int src, int dst, void* buf, size_t n)
        : Work(fp),
          sh_(std::move(sh)),
          src_(src),
          dst_(dst),
          tag_(fp.tag.id < 0 ? 0 : int(fp.tag.id)),
          buf_(buf),
          bytes_(n) {}
    bool test() override { return take(false); }
    void wait() override { take(true); }

  private:
    bool take(bool block) {
        if (done_) return true;
        std::unique_lock lock(sh_->mu);
        auto& box = sh_->mail[{src_, dst_, tag_}];
        const auto deadline = Clock::now() + std::chrono::duration<double>(sh_->options.timeout_s);
        while (box.empty() && sh_->failure.empty()) {
            if (!block) return false;
            if (sh_->cv.wait_until(lock, deadline) == std::cv_status::timeout && box.empty()) {
                sh_->failure =
                    fmt::format("{}: rank {} waits in {} for {:.1f} s; rank {} never sent",
                                sh_->name, sh_->world_ranks[size_t(dst_)], fp_.describe(),
                                sh_->options.timeout_s, sh_->world_ranks[size_t(src_)]);
                sh_->cv.notify_all();
            }
        }
        if (box.empty()) throw CommError(sh_->failure);
        std::vector<char> msg = std::move(box.front());
        box.pop_front();
        if (msg.size() != bytes_) {
            throw CommError(fmt::format("{}: {} expected {} bytes but rank {} sent {}", sh_->name,
                                        fp_.describe(), bytes_, sh_->world_ranks[size_t(src_)],
                                        msg.size()));
        }
        std::memcpy(buf_, msg.data(), bytes_);
        done_ = true;
        return true;
    }
    std::shared_ptr<Shared> sh_;
    int src_, dst_, tag_;
    void* buf_;
    size_t bytes_;
    bool done_ = false;
};

class ThreadGroup : public ProcessGroup {
  public:
    ThreadGroup(std::shared_ptr<Shared> sh, int rank)
        : ProcessGroup(rank, int(sh->world_ranks.size()), sh->name, sh->world_ranks),
          sh_(std::move(sh)),
          monitor_(sh_->name, sh_->world_ranks, sh_->world_ranks[size_t(rank)]) {
        std::lock_guard lock(sh_->mu);
        sh_->monitors[size_t(rank)] = &monitor_;
    }
    ~ThreadGroup() override {
        std::lock_guard lock(sh_->mu);
        sh_->monitors[size_t(rank())] = nullptr;
    }

    WorkHandle all_reduce(void* buf, int64_t count, DType dt, ReduceOp op, Tag tag) override {
        check_reducible(dt, op);
        if (small_path(dt, op)) {
            return collective({CollOp::all_reduce, dt, count, tag}, buf, buf, [&](auto& slots) {
                void* acc = reduce_typed(slots, count, dt, op);
                return [=, this] { std::memcpy(buf, acc, bytes_of(count, dt)); };
            });
        }
        return collective({CollOp::all_reduce, dt, count, tag}, buf, buf, [&](auto& slots) {
            float* acc = sum_f32(
                slots, count, dt, [](const Shared::Slot& s) { return s.recv; }, 0);
            return [=, this] { store(acc, buf, count, dt, op); };
        });
    }

    WorkHandle reduce_scatter(const void* send, void* recv, int64_t recv_count, DType dt,
                              ReduceOp op, Tag tag) override {
        check_reducible(dt, op, false);
        const size_t offset = bytes_of(recv_count * rank(), dt);
        return collective(
            {CollOp::reduce_scatter, dt, recv_count, tag}, send, recv, [&](auto& slots) {
                float* acc = sum_f32(
                    slots, recv_count, dt, [](const Shared::Slot& s) { return s.send; }, offset);
                return [=, this] { store(acc, recv, recv_count, dt, op); };
            });
    }

    WorkHandle all_gather(const void* send, void* recv, int64_t send_count, DType dt,
                          Tag tag) override {
        const size_t block = bytes_of(send_count, dt);
        return collective({CollOp::all_gather, dt, send_count, tag}, send, recv, [&](auto& slots) {
            char* tmp = static_cast<char*>(scratch_.ensure(block * size_t(size())));
            for (int r = 0; r < size(); ++r) {
                std::memcpy(tmp + block * size_t(r), slots[size_t(r)].send, block);
            }
            return [=, this] { std::memcpy(recv, tmp, block * size_t(size())); };
        });
    }

    WorkHandle broadcast(void* buf, int64_t count, DType dt, int root, Tag tag) override {
        check_peer(root);
        const size_t n = bytes_of(count, dt);
        return collective({CollOp::broadcast, dt, count, tag, root}, buf, buf, [&](auto& slots) {
            char* tmp = static_cast<char*>(scratch_.ensure(n));
            std::memcpy(tmp, slots[size_t(root)].recv, n);
            return [=] { std::memcpy(buf, tmp, n); };
        });
    }

    WorkHandle all_to_all(const void* send, void* recv, int64_t count, DType dt, Tag tag) override {
        const size_t block = bytes_of(count, dt);
        return collective({CollOp::all_to_all, dt, count, tag}, send, recv, [&](auto& slots) {
            char* tmp = static_cast<char*>(scratch_.ensure(block * size_t(size())));
            for (int r = 0; r < size(); ++r) {
                const char* src = static_cast<const char*>(slots[size_t(r)].send);
                std::memcpy(tmp + block * size_t(r), src + block * size_t(rank()), block);
            }
            return [=, this] { std::memcpy(recv, tmp, block * size_t(size())); };
        });
    }

    WorkHandle send(const void* buf, int64_t count, DType dt, int dst, Tag tag) override {
        check_peer(dst);
        Fingerprint fp{CollOp::send, dt, count, tag, dst, p2p_seq_++};
        count_traffic(CollOp::send, message_bytes(fp, size()));
        const char* p = static_cast<const char*>(buf);
        std::lock_guard lock(sh_->mu);
        if (!sh_->failure.empty()) throw CommError(sh_->failure);
        sh_->mail[{rank(), dst, tag.id < 0 ? 0 : int(tag.id)}].emplace_back(
            p, p + bytes_of(count, dt));
        sh_->cv.notify_all();
        return std::make_shared<DoneWork>(fp);
    }

    WorkHandle recv(void* buf, int64_t count, DType dt, int src, Tag tag) override {
        check_peer(src);
        Fingerprint fp{CollOp::recv, dt, count, tag, src, p2p_seq_++};
        count_traffic(CollOp::recv, message_bytes(fp, size()));
        return std::make_shared<RecvWork>(fp, sh_, src, rank(), buf, bytes_of(count, dt));
    }

    WorkHandle barrier(Tag tag) override {
        return collective({CollOp::barrier, DType::f32, 0, tag}, nullptr, nullptr,
                          [](auto&) { return [] {}; });
    }

    std::shared_ptr<ProcessGroup> split(int color, int key, const std::string& name) override {
        std::shared_ptr<Shared> child;
        int child_rank = -1;
        const uint64_t seq = seq_;
        collective(
            {CollOp::split, DType::f32, 0, Tag{}}, nullptr, nullptr, [](auto&) { return [] {}; },
            [&](auto& slots) {
                if (color < 0) return;
                std::vector<std::pair<int, int>> members;  // (key, rank)
                for (int r = 0; r < size(); ++r) {
                    if (slots[size_t(r)].color == color)
                        members.push_back({slots[size_t(r)].key, r});
                }
                std::sort(members.begin(), members.end());
                std::vector<int> world;
                for (size_t i = 0; i < members.size(); ++i) {
                    world.push_back(world_ranks()[size_t(members[i].second)]);
                    if (members[i].second == rank()) child_rank = int(i);
                }
                auto& c = sh_->children[{seq, color}];
                if (!c) c = std::make_shared<Shared>(name, world, sh_->options);
                child = c;
            },
            color, key);
        if (!child) return nullptr;
        return std::make_shared<ThreadGroup>(child, child_rank);
    }

    void reserve_scratch(CollOp op, int64_t count, DType dt) override {
        // Reductions accumulate in f32 (or their own wider type); the
        // gathers stage every rank's block.
        const size_t esz = core::dtype_size(dt);
        size_t bytes = size_t(count) * std::max<size_t>(esz, 4);
        if (op == CollOp::all_gather || op == CollOp::all_to_all) {
            bytes = size_t(count) * esz * size_t(size());
        }
        scratch_.ensure(bytes);
    }

  private:
    // Elementwise max or sum of every rank's buffer in its own type (the
    // small-message path: max, i64, f64), into scratch.
    template <class T>
    T* reduce_as(std::vector<Shared::Slot>& slots, int64_t count, ReduceOp op) {
        T* acc = static_cast<T*>(scratch_.ensure(size_t(count) * sizeof(T)));
        std::memcpy(acc, slots[0].recv, size_t(count) * sizeof(T));
        for (size_t r = 1; r < slots.size(); ++r) {
            const T* in = static_cast<const T*>(slots[r].recv);
            for (int64_t i = 0; i < count; ++i) {
                acc[i] = op == ReduceOp::max ? std::max(acc[i], in[i]) : T(acc[i] + in[i]);
            }
        }
        if (op == ReduceOp::avg) {
            for (int64_t i = 0; i < count; ++i) acc[i] = T(acc[i] / T(slots.size()));
        }
        return acc;
    }
    void* reduce_typed(std::vector<Shared::Slot>& slots, int64_t count, DType dt, ReduceOp op) {
        switch (dt) {
            case DType::i64:
                return reduce_as<int64_t>(slots, count, op);
            case DType::f64:
                return reduce_as<double>(slots, count, op);
            case DType::f32:
                return reduce_as<float>(slots, count, op);
            default:
                break;
        }
        // bf16 max: through f32.
        std::vector<std::vector<float>> wide(slots.size(), std::vector<float>(size_t(count)));
        std::vector<Shared::Slot> as_f32 = slots;
        for (size_t r = 0; r < slots.size(); ++r) {
            bf16_to_f32(static_cast<const uint16_t*>(slots[r].recv), wide[r].data(), count);
            as_f32[r].recv = wide[r].data();
        }
        const float* m = reduce_as<float>(as_f32, count, op);
        std::vector<float> copy(m, m + count);
        uint16_t* out = static_cast<uint16_t*>(scratch_.ensure(size_t(count) * 2));
        f32_to_bf16(copy.data(), out, count);
        return out;
    }

    // Sums every rank's input (at byte `offset` of the pointer `pick` selects)
    // into f32 scratch.
    template <class Pick>
    float* sum_f32(std::vector<Shared::Slot>& slots, int64_t count, DType dt, Pick pick,
                   size_t offset) {
        float* acc = scratch_.ensure_as<float>(size_t(count));
        std::memset(acc, 0, size_t(count) * sizeof(float));
        for (const auto& s : slots) {
            const char* in = static_cast<const char*>(pick(s)) + offset;
            if (dt == DType::f32)
                add_into(acc, reinterpret_cast<const float*>(in), count);
            else
                add_bf16_into(acc, reinterpret_cast<const uint16_t*>(in), count);
        }
        return acc;
    }
    void store(float* acc, void* out, int64_t count, DType dt, ReduceOp op) {
        if (op == ReduceOp::avg) scale_f32(acc, count, 1.0f / float(size()));
        if (dt == DType::f32)
            std::memcpy(out, acc, size_t(count) * 4);
        else
            f32_to_bf16(acc, static_cast<uint16_t*>(out), count);
    }

    // Rendezvous of every rank: post, barrier, check the fingerprints, compute
    // (reading peers' buffers), barrier, write own outputs. Between the second
    // barrier and the next call's first, a rank touches only its own memory.
    template <class Compute, class Post = void (*)(std::vector<Shared::Slot>&)>
    WorkHandle collective(Fingerprint fp, const void* send, void* recv, Compute compute,
                          Post post = nullptr, int color = 0, int key = 0) {
        fp.seq = seq_++;
        monitor_.begin(fp);
        const int64_t bytes = message_bytes(fp, size());
        count_traffic(fp.op, bytes);
        core::trace::Event span_proto;
        if (core::trace::on()) {
            span_proto.name = op_name(fp.op);
            span_proto.kind = core::trace::Kind::comm;
            span_proto.detail = "threads";
            span_proto.tag = fp.tag.kind;
            span_proto.bytes = bytes;
            span_proto.id = fp.tag.id;
        }
        core::trace::Span span(span_proto);
        {
            std::lock_guard lock(sh_->mu);
            auto& slot = sh_->slots[size_t(rank())];
            slot.send = send;
            slot.recv = recv;
            slot.fp = fp;
            slot.color = color;
            slot.key = key;
        }
        rendezvous();
        if (sh_->options.verify) check_match();
        auto finish = compute(sh_->slots);
        rendezvous();
        if constexpr (!std::is_same_v<Post, void (*)(std::vector<Shared::Slot>&)>) {
            {
                std::lock_guard lock(sh_->mu);
                post(sh_->slots);
            }
            rendezvous();
        }
        finish();
        monitor_.end(fp);
        return std::make_shared<DoneWork>(fp);
    }

    void check_match() {
        // Every rank reads the same slots, so every rank reaches the same verdict.
        const auto& slots = sh_->slots;
        for (const auto& s : slots) {
            if (!s.fp.same_call(slots[0].fp) || s.fp.seq != slots[0].fp.seq) {
                std::lock_guard lock(sh_->mu);
                if (sh_->failure.empty()) sh_->failure = diagnose_locked(*sh_);
                throw CommError(sh_->failure);
            }
        }
    }

    void rendezvous() {
        std::unique_lock lock(sh_->mu);
        if (!sh_->failure.empty()) throw CommError(sh_->failure);
        const uint64_t gen = sh_->generation;
        if (++sh_->arrived == size()) {
            sh_->arrived = 0;
            ++sh_->generation;
            sh_->cv.notify_all();
            return;
        }
        const auto deadline = Clock::now() + std::chrono::duration<double>(sh_->options.timeout_s);
        while (sh_->generation == gen && sh_->failure.empty()) {
            if (sh_->cv.wait_until(lock, deadline) == std::cv_status::timeout &&
                sh_->generation == gen && sh_->failure.empty()) {
                sh_->failure = "timeout after " +
                               fmt::format("{:.1f} s: ", sh_->options.timeout_s) +
                               diagnose_locked(*sh_);
                sh_->cv.notify_all();
            }
        }
        if (sh_->generation == gen) throw CommError(sh_->failure);
    }

    std::shared_ptr<Shared> sh_;
    GroupMonitor monitor_;
    ScratchBuffer scratch_;
    uint64_t seq_ = 0;
    uint64_t p2p_seq_ = 0;
};

}  // namespace

std::vector<std::shared_ptr<ProcessGroup>> make_thread_world(int size, ThreadWorldOptions options) {
    if (size < 1) throw CommError(fmt::format("thread world size must be >= 1, got {}", size));
    std::vector<int> ranks(static_cast<size_t>(size), 0);
    for (int r = 0; r < size; ++r) ranks[size_t(r)] = r;
    auto sh = std::make_shared<Shared>("world", ranks, options);
    std::vector<std::shared_ptr<ProcessGroup>> out;
    for (int r = 0; r < size; ++r) out.push_back(std::make_shared<ThreadGroup>(sh, r));
    return out;
}

void run_threads(int size, const std::function<void(ProcessGroup&)>& fn,
                 ThreadWorldOptions options) {
    auto world = make_thread_world(size, options);
    std::vector<std::exception_ptr> errors(static_cast<size_t>(size));
    std::vector<std::thread> threads;
    for (int r = 0; r < size; ++r) {
        threads.emplace_back([&, r] {
            try {
                fn(*world[size_t(r)]);
            } catch (...) {
                errors[size_t(r)] = std::current_exception();
            }
        });
    }
    for (auto& t : threads) t.join();
    for (auto& e : errors) {
        if (e) std::rethrow_exception(e);
    }
}

}  // namespace apiary::comm
