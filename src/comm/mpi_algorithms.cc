// The algorithms the MPI backend runs on the thread executing a call: the
// flat, ring and hierarchical all-reduce and the ring reduce-scatter.

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "comm/mpi_internal.h"
#include "core/error.h"

namespace apiary::comm::detail {

int as_int(int64_t n, const Engine& e, const char* what) {
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
// (BENCHMARKS.md, "Benchmarks: comm"). Below 32 MiB the temporary is reused from the heap
// and MPI's all-reduce is as fast as the ring, so the ring starts at 32 MiB.
// MPI's reduce-scatter is slower than the ring from 4 MiB of input already.
// (Constants in mpi_internal.h.)
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
void ring_reduce_scatter(Engine& e, const float* send, float* out, const Chunks& c,
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
void ring_all_gather(Engine& e, float* data, const Chunks& c, const CallContext& ctx) {
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
void all_reduce_f32(Engine& e, float* data, int64_t n, const CallContext& ctx) {
    if (!e.hierarchical.load() && n * 4 >= kRingAllReduceBytes && n / e.size < (int64_t(1) << 30)) {
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

}  // namespace apiary::comm::detail
