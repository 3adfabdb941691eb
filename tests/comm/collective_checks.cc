#include "collective_checks.h"

#include <gtest/gtest.h>

#include <functional>
#include <vector>

#include "comm/buffer.h"
#include "core/error.h"
#include "comm/mesh.h"

namespace apiary::comm::testing {

namespace {

float value(int rank, int64_t i) { return float((rank + 1) * (i % 7 + 1)); }

// Buffer of n elements of dt, filled from f(i) and read back as float.
struct Buf {
    Buf(DType dt, int64_t n) : dt(dt), f(size_t(n)), h(size_t(n)) {}
    void fill(const std::function<float(int64_t)>& fn) {
        for (size_t i = 0; i < f.size(); ++i) f[i] = fn(int64_t(i));
        f32_to_bf16(f.data(), h.data(), int64_t(f.size()));
    }
    void* data() { return dt == DType::f32 ? static_cast<void*>(f.data()) : h.data(); }
    float at(int64_t i) {
        if (dt == DType::f32) return f[size_t(i)];
        float x;
        bf16_to_f32(&h[size_t(i)], &x, 1);
        return x;
    }
    DType dt;
    std::vector<float> f;
    std::vector<uint16_t> h;
};

}  // namespace

void check_all_reduce(ProcessGroup& g, DType dt, ReduceOp op, int64_t count) {
    Buf b(dt, count);
    b.fill([&](int64_t i) { return value(g.rank(), i); });
    auto w = g.all_reduce(b.data(), count, dt, op, Tag{"bucket", 3});
    EXPECT_EQ(w->fingerprint().op, CollOp::all_reduce);
    w->wait();
    EXPECT_TRUE(w->test());
    const float ranks_sum = float(g.size() * (g.size() + 1) / 2);
    for (int64_t i = 0; i < count; ++i) {
        float want = ranks_sum * float(i % 7 + 1);
        if (op == ReduceOp::avg) want /= float(g.size());
        if (dt == DType::bf16) {  // the f32 result is rounded once
            uint16_t h;
            f32_to_bf16(&want, &h, 1);
            bf16_to_f32(&h, &want, 1);
        }
        ASSERT_EQ(b.at(i), want) << "element " << i << " rank " << g.rank();
    }
}

void check_reduce_scatter(ProcessGroup& g, DType dt, bool in_place, int64_t count) {
    const int64_t total = count * g.size();
    Buf send(dt, total), recv(dt, count);
    send.fill([&](int64_t i) { return value(g.rank(), i); });
    const size_t esz = core::dtype_size(dt);
    void* out =
        in_place ? static_cast<char*>(send.data()) + esz * size_t(count * g.rank()) : recv.data();
    g.reduce_scatter(send.data(), out, count, dt, ReduceOp::sum)->wait();
    const float ranks_sum = float(g.size() * (g.size() + 1) / 2);
    for (int64_t i = 0; i < count; ++i) {
        const int64_t gi = count * g.rank() + i;
        const float got = in_place ? send.at(gi) : recv.at(i);
        ASSERT_EQ(got, ranks_sum * float(gi % 7 + 1)) << "element " << i;
    }
}

void check_all_gather(ProcessGroup& g, DType dt, bool in_place, int64_t count) {
    const int64_t total = count * g.size();
    Buf send(dt, count), recv(dt, total);
    send.fill([&](int64_t i) { return value(g.rank(), i); });
    const size_t esz = core::dtype_size(dt);
    if (in_place) {
        recv.fill(
            [&](int64_t i) { return i / count == g.rank() ? value(g.rank(), i % count) : -1; });
        void* mine = static_cast<char*>(recv.data()) + esz * size_t(count * g.rank());
        g.all_gather(mine, recv.data(), count, dt)->wait();
    } else {
        g.all_gather(send.data(), recv.data(), count, dt)->wait();
    }
    for (int64_t i = 0; i < total; ++i) {
        ASSERT_EQ(recv.at(i), value(int(i / count), i % count)) << "element " << i;
    }
}

void check_broadcast(ProcessGroup& g, int root, int64_t count) {
    std::vector<float> b(static_cast<size_t>(count), -1.0f);
    if (g.rank() == root) {
        for (int64_t i = 0; i < count; ++i) b[size_t(i)] = value(root, i);
    }
    auto w = g.broadcast(b.data(), count, DType::f32, root);
    EXPECT_EQ(w->fingerprint().peer, root);
    w->wait();
    for (int64_t i = 0; i < count; ++i) ASSERT_EQ(b[size_t(i)], value(root, i));
}

void check_all_to_all(ProcessGroup& g, int64_t count) {
    const int n = g.size();
    std::vector<float> send(size_t(count * n)), recv(size_t(count * n), -1.0f);
    // Block j goes to rank j and says who sent it to whom.
    for (int j = 0; j < n; ++j) {
        for (int64_t i = 0; i < count; ++i) send[size_t(j * count + i)] = float(g.rank() * 100 + j);
    }
    g.all_to_all(send.data(), recv.data(), count, DType::f32)->wait();
    for (int j = 0; j < n; ++j) {
        for (int64_t i = 0; i < count; ++i) {
            ASSERT_EQ(recv[size_t(j * count + i)], float(j * 100 + g.rank()));
        }
    }
}

void check_all_to_all_v(ProcessGroup& g) {
    // Rank r sends r + j + 1 elements to rank j (its own block included),
    // except rank 0, which sends nothing to the last rank: an empty block.
    const int n = g.size(), me = g.rank();
    auto count = [n](int from, int to) -> int64_t {
        return from == 0 && to == n - 1 && n > 1 ? 0 : from + to + 1;
    };
    std::vector<int64_t> sc(static_cast<size_t>(n)), rc(static_cast<size_t>(n));
    std::vector<float> send, recv;
    for (int j = 0; j < n; ++j) {
        sc[size_t(j)] = count(me, j);
        rc[size_t(j)] = count(j, me);
        for (int64_t i = 0; i < sc[size_t(j)]; ++i) {
            send.push_back(float(me * 1000 + j * 10) + float(i) / 64);
        }
    }
    int64_t total = 0;
    for (int64_t c : rc) total += c;
    recv.assign(size_t(total), -1.0f);
    g.all_to_all_v(send.data(), sc, recv.data(), rc, DType::f32, {"a2av", 1})->wait();
    size_t at = 0;
    for (int j = 0; j < n; ++j) {
        for (int64_t i = 0; i < rc[size_t(j)]; ++i, ++at) {
            ASSERT_EQ(recv[at], float(j * 1000 + me * 10) + float(i) / 64) << "from " << j;
        }
    }
    // One count per rank, or a CommError naming the group.
    EXPECT_THROW(g.all_to_all_v(send.data(), {1}, recv.data(), {}, DType::f32), apiary::CommError);
}

void check_send_recv_ring(ProcessGroup& g, int64_t count) {
    const int next = (g.rank() + 1) % g.size(), prev = (g.rank() + g.size() - 1) % g.size();
    std::vector<float> out(static_cast<size_t>(count)), in(static_cast<size_t>(count), -1.0f);
    for (int64_t i = 0; i < count; ++i) out[size_t(i)] = value(g.rank(), i);
    // Both directions posted before either waits: neither backend may deadlock.
    auto s = g.send(out.data(), count, DType::f32, next);
    auto r = g.recv(in.data(), count, DType::f32, prev);
    r->wait();
    s->wait();
    for (int64_t i = 0; i < count; ++i) ASSERT_EQ(in[size_t(i)], value(prev, i));
}

void check_many_outstanding(ProcessGroup& g) {
    // Eight buckets in flight at once, waited in reverse: order of issue, not
    // of waiting, decides execution.
    constexpr int kBuckets = 8;
    constexpr int64_t kCount = 1000;
    std::vector<std::vector<float>> bufs(kBuckets, std::vector<float>(kCount));
    std::vector<WorkHandle> works;
    for (int b = 0; b < kBuckets; ++b) {
        for (int64_t i = 0; i < kCount; ++i) bufs[size_t(b)][size_t(i)] = float(b + g.rank());
        works.push_back(g.all_reduce(bufs[size_t(b)].data(), kCount, DType::f32, ReduceOp::sum,
                                     Tag{"bucket", b}));
    }
    for (int b = kBuckets - 1; b >= 0; --b) works[size_t(b)]->wait();
    for (int b = 0; b < kBuckets; ++b) {
        EXPECT_EQ(works[size_t(b)]->fingerprint().seq, works[0]->fingerprint().seq + uint64_t(b));
        const float want = float(b * g.size() + g.size() * (g.size() - 1) / 2);
        for (int64_t i = 0; i < kCount; ++i) ASSERT_EQ(bufs[size_t(b)][size_t(i)], want);
    }
}

void check_mesh(ProcessGroup& world, int dp, int tp, int pp, const char* order) {
    const MeshShape shape = resolve_mesh(world.size(), dp, tp, pp, order);
    DeviceMesh mesh(std::shared_ptr<ProcessGroup>(&world, [](ProcessGroup*) {}), shape);
    EXPECT_EQ(mesh.dp().size(), shape.dp);
    EXPECT_EQ(mesh.tp().size(), shape.tp);
    EXPECT_EQ(mesh.pp().size(), shape.pp);
    EXPECT_EQ(rank_of(shape, mesh.coord()), world.rank());
    // Each axis group holds exactly the ranks that differ only along that axis:
    // summing the world ranks over the group checks membership in closed form.
    for (Axis a : {Axis::dp, Axis::tp, Axis::pp}) {
        ProcessGroup& g = *mesh.group(a);
        EXPECT_EQ(g.rank(), mesh.coord().at(a));
        float sum = float(world.rank());
        g.all_reduce(&sum, 1, DType::f32, ReduceOp::sum)->wait();
        float want = 0;
        for (int k = 0; k < shape.size(a); ++k) {
            MeshCoord c = mesh.coord();
            (a == Axis::dp ? c.dp : a == Axis::tp ? c.tp : c.pp) = k;
            want += float(rank_of(shape, c));
            EXPECT_EQ(g.world_ranks()[size_t(k)], rank_of(shape, c));
        }
        EXPECT_EQ(sum, want) << axis_name(a);
    }
}

}  // namespace apiary::comm::testing
