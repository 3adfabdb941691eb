// The algorithms the MPI backend runs on the thread executing a call: the
// flat, ring and hierarchical all-reduce, the ring reduce-scatter in pieces,
// and the scratch each needs.

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "comm/mpi_internal.h"
#include "core/error.h"

namespace apiary::comm::detail {

int as_int(int64_t n, const MpiGroupState& e, const char* what) {
    if (n < 0 || n > std::numeric_limits<int>::max()) {
        throw CommError(
            fmt::format("{}: {} count {} is outside 0..2^31-1; split the call", e.name, what, n));
    }
    return int(n);
}

// Large messages take apiary's own ring algorithms, whose temporary chunks
// live in the group's persistent scratch. MPI's own all-reduce mallocs a
// message-sized temporary per call; from glibc's 32 MiB mmap ceiling on, every
// call maps fresh pages and faults them in, which on the VM we measured made
// a 64 MiB MPI_Allreduce 6x and a 256 MiB one 11x slower than this ring
// (BENCHMARKS.md, "Benchmarks: comm"). Below 32 MiB on one host MPI's
// all-reduce is as fast as the ring, but across hosts OpenMPI 4.1 picks
// algorithms that move about twice the ring's bytes: on the test cluster's
// 4 hosts at 400 Mbit/s a 16 MiB all-reduce took 1.09 s through
// MPI_Allreduce and 0.64 s through this ring (the ring's alpha-beta time:
// 0.53 s), so in a group that spans hosts the ring starts at 1 MiB
// (BENCHMARKS.md, "Many hosts: collectives"). MPI's reduce-scatter is slower than the ring from 4
// MiB of input already. (Constants in mpi_internal.h.)
Chunks even_chunks(int64_t total, int n) {
    Chunks c;
    for (int i = 0, o = 0; i < n; ++i) {
        const int64_t l = total / n + (i < total % n ? 1 : 0);
        c.off.push_back(o);
        c.len.push_back(l);
        o += int(l);
    }
    return c;
}

// Ring reduce-scatter: after n-1 steps this rank holds the sum of chunk
// `rank` in out (which may alias that chunk of send; send is otherwise only
// read). Each step forwards the partial sum received in the previous step,
// plus this rank's contribution.
void ring_reduce_scatter(MpiGroupState& e, const float* send, float* out, const Chunks& c,
                         const CallContext& ctx) {
    const int n = e.size, r = e.rank;
    if (n == 1) {
        if (out != send + c.off[0]) std::memmove(out, send + c.off[0], size_t(c.len[0]) * 4);
        return;
    }
    const int left = (r - 1 + n) % n, right = (r + 1) % n;
    const int64_t max_len = *std::max_element(c.len.begin(), c.len.end());
    float* tmp = e.ring.ensure_as<float>(size_t(2 * max_len));
    const float* outgoing = send + c.off[size_t(left)];
    int64_t out_len = c.len[size_t(left)];
    for (int s = 0; s < n - 1; ++s) {
        const size_t in_chunk = size_t((r - s - 2 + 2 * n) % n);
        float* in = tmp + (s % 2) * max_len;
        const int64_t in_len = c.len[in_chunk];
        mpi_check(MPI_Sendrecv(outgoing, int(out_len), MPI_FLOAT, right, 11, in, int(in_len),
                               MPI_FLOAT, left, 11, e.comm, MPI_STATUS_IGNORE),
                  "MPI_Sendrecv (ring reduce-scatter)", ctx);
        const float* mine = send + c.off[in_chunk];
        float* dst = s == n - 2 ? out : in;
        for (int64_t i = 0; i < in_len; ++i) dst[i] = in[i] + mine[i];
        outgoing = in;
        out_len = in_len;
    }
}

// Ring all-gather in place: chunk `rank` of data is this rank's; after n-1
// steps every chunk is.
void ring_all_gather(MpiGroupState& e, float* data, const Chunks& c, const CallContext& ctx) {
    const int n = e.size, r = e.rank;
    const int left = (r - 1 + n) % n, right = (r + 1) % n;
    for (int s = 0; s < n - 1; ++s) {
        const size_t send_chunk = size_t((r - s + n) % n), recv_chunk = size_t((r - s - 1 + n) % n);
        mpi_check(MPI_Sendrecv(data + c.off[send_chunk], int(c.len[send_chunk]), MPI_FLOAT, right,
                               12, data + c.off[recv_chunk], int(c.len[recv_chunk]), MPI_FLOAT,
                               left, 12, e.comm, MPI_STATUS_IGNORE),
                  "MPI_Sendrecv (ring all-gather)", ctx);
    }
}

// f32 sum all-reduce of n elements in place, flat or hierarchical.
void all_reduce_f32(MpiGroupState& e, float* data, int64_t n, const CallContext& ctx) {
    if (!e.hierarchical.load() && n * 4 >= e.ring_all_reduce_from() &&
        n / e.size < (int64_t(1) << 30)) {
        const Chunks c = even_chunks(n, e.size);
        ring_reduce_scatter(e, data, data + c.off[size_t(e.rank)], c, ctx);
        ring_all_gather(e, data, c, ctx);
        return;
    }
    if (!e.hierarchical.load()) {
        constexpr int64_t kChunk = int64_t(1) << 30;  // MPI counts are int
        for (int64_t off = 0; off < n; off += kChunk) {
            const int c = int(std::min(kChunk, n - off));
            mpi_check(MPI_Allreduce(MPI_IN_PLACE, data + off, c, MPI_FLOAT, MPI_SUM, e.comm),
                      "MPI_Allreduce", ctx);
        }
        return;
    }
    int lsize = 1, lrank = 0;
    MPI_Comm_size(e.local, &lsize);
    MPI_Comm_rank(e.local, &lrank);
    as_int(n, e, "hierarchical all_reduce");
    std::vector<int> counts(static_cast<size_t>(lsize)), displs(static_cast<size_t>(lsize));
    for (int i = 0, off = 0; i < lsize; ++i) {
        counts[size_t(i)] = int(n / lsize + (i < n % lsize ? 1 : 0));
        displs[size_t(i)] = off;
        off += counts[size_t(i)];
    }
    const int mine = counts[size_t(lrank)];
    float* shard = e.shard.ensure_as<float>(size_t(std::max(mine, 1)));
    mpi_check(MPI_Reduce_scatter(data, shard, counts.data(), MPI_FLOAT, MPI_SUM, e.local),
              "MPI_Reduce_scatter (node-local)", ctx);
    mpi_check(MPI_Allreduce(MPI_IN_PLACE, shard, mine, MPI_FLOAT, MPI_SUM, e.cross),
              "MPI_Allreduce (inter-node)", ctx);
    mpi_check(MPI_Allgatherv(shard, mine, MPI_FLOAT, data, counts.data(), displs.data(), MPI_FLOAT,
                             e.local),
              "MPI_Allgatherv (node-local)", ctx);
}

namespace {
constexpr int64_t kPieceAlign = 16;  // floats: pieces start on 64-byte boundaries

bool ring_reduce_scatter_for(int64_t n, int size) {
    return n * size * 4 >= kRingReduceScatterBytes;
}
}  // namespace

int64_t piece_len(int64_t n, int size) {
    const int64_t per_block = kCollectivePieceBytes / 4 / size / kPieceAlign * kPieceAlign;
    return std::min(n, std::max(kPieceAlign, per_block));
}

// The ring in pieces: piece [a, a + len) of every block is one ring
// reduce-scatter whose chunk i is that range of block i, so every element is
// summed in the order the ring over whole blocks would sum it (the order
// depends on the chunk's index only), scaled and rounded alike: the result
// is the same bit for bit, and the scratch is that of one piece.
void reduce_scatter(MpiGroupState& e, const void* send, void* recv, int64_t n, DType dt,
                    ReduceOp op, const CallContext& ctx) {
    const int size = e.size;
    const bool bf16 = dt == DType::bf16;
    if (!ring_reduce_scatter_for(n, size)) {
        const float* in = static_cast<const float*>(send);
        float* out = static_cast<float*>(recv);
        if (bf16) {
            // Sum in f32: widen everything, reduce, round our block once at the end.
            float* wide = e.scratch.ensure_as<float>(size_t(n) * size_t(size));
            bf16_to_f32(static_cast<const uint16_t*>(send), wide, n * size);
            in = wide;
            out = wide + n * e.rank;
        }
        float* whole = const_cast<float*>(in);
        const bool in_place = out == in + n * e.rank;
        // In place, MPI leaves the result at the front of the buffer.
        mpi_check(MPI_Reduce_scatter_block(in_place ? MPI_IN_PLACE : in, in_place ? whole : out,
                                           int(n), MPI_FLOAT, MPI_SUM, e.comm),
                  "MPI_Reduce_scatter_block", ctx);
        if (in_place && out != whole) std::memmove(out, whole, size_t(n) * sizeof(float));
        if (op == ReduceOp::avg) scale_f32(out, n, 1.0f / float(size));
        if (bf16) f32_to_bf16(out, static_cast<uint16_t*>(recv), n);
        return;
    }
    const int64_t piece = piece_len(n, size);
    Chunks c;
    c.off.resize(size_t(size));
    c.len.resize(size_t(size));
    for (int64_t a = 0; a < n; a += piece) {
        const int64_t len = std::min(piece, n - a);
        const float* in = static_cast<const float*>(send);
        float* out = static_cast<float*>(recv) + a;
        for (int i = 0; i < size; ++i) {
            c.off[size_t(i)] = bf16 ? i * len : i * n + a;
            c.len[size_t(i)] = len;
        }
        if (bf16) {
            float* wide = e.scratch.ensure_as<float>(size_t(piece) * size_t(size));
            const auto* half = static_cast<const uint16_t*>(send);
            for (int i = 0; i < size; ++i) bf16_to_f32(half + i * n + a, wide + i * len, len);
            in = wide;
            out = wide + e.rank * len;
        }
        ring_reduce_scatter(e, in, out, c, ctx);
        if (op == ReduceOp::avg) scale_f32(out, len, 1.0f / float(size));
        if (bf16) f32_to_bf16(out, static_cast<uint16_t*>(recv) + a, len);
    }
}

ScratchNeed scratch_need(const MpiGroupState& e, CollOp op, int64_t count, DType dt) {
    ScratchNeed need;
    const bool bf16 = dt == DType::bf16;
    if (op == CollOp::reduce_scatter) {
        if (!ring_reduce_scatter_for(count, e.size)) {
            if (bf16) need.scratch = size_t(count) * size_t(e.size) * 4;
            return need;
        }
        const int64_t piece = piece_len(count, e.size);
        need.ring = e.size > 1 ? size_t(2 * piece) * 4 : 0;
        if (bf16) need.scratch = size_t(piece) * size_t(e.size) * 4;
        return need;
    }
    if (op != CollOp::all_reduce) return need;
    if (bf16) need.scratch = size_t(count) * 4;
    if (e.hierarchical.load()) {
        int lsize = 1;
        MPI_Comm_size(e.local, &lsize);
        need.shard = size_t(std::max<int64_t>(count / lsize + 1, 1)) * 4;
    } else if (count * 4 >= e.ring_all_reduce_from() && e.size > 1) {
        need.ring = size_t(2 * (count / e.size + 1)) * 4;
    }
    return need;
}

}  // namespace apiary::comm::detail
