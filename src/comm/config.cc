#include "comm/config.h"

namespace apiary::comm {

void add_keys(core::Schema& s) {
    s.add_string("comm.backend", "mpi",
                 "collectives backend: mpi (processes under mpirun/srun) or thread (ranks as "
                 "threads in one process, for tests)",
                 {"mpi", "thread"});
    s.add_real("comm.timeout_s", 300.0,
               "a collective waiting longer than this makes every rank report where it is and "
               "the job exit non-zero",
               0.1, 1e7);
    s.add_real("comm.bucket_mb", 25.0, "data-parallel gradient bucket size in MiB", 0.001, 1e5);
    s.add_bool("comm.hierarchical", false,
               "all-reduce as node-local reduce-scatter, inter-node all-reduce, node-local "
               "all-gather (instead of one flat MPI_Allreduce)");
    s.add_int("comm.nodes_hint", 0,
              "0: nodes are shared-memory domains; N > 0: treat the ranks as N equal nodes "
              "(tests one machine as several)",
              0, 1 << 20);
    s.add_string("comm.grad_dtype", "fp32",
                 "data-parallel gradients travel as fp32, or as bf16 (half the bytes; summed "
                 "in fp32, rounded once)",
                 {"fp32", "bf16"});
    s.add_bool("comm.verify", true,
               "check that every rank calls the same collectives (op, dtype, count, tag, root) "
               "in the same order: a hash of all calls so far is compared across ranks by a "
               "32-byte all-reduce before the calls that comm.verify_first and "
               "comm.verify_every choose");
    s.add_int("comm.verify_first", 256,
              "the match check runs before each of a group's first N calls (a mismatch there "
              "is caught before the call runs)",
              0, 1 << 30);
    s.add_int("comm.verify_every", 64,
              "after the first calls, the match check runs before every N-th call and covers "
              "the calls since the previous check (a mismatch is caught at most N - 1 calls "
              "late); 1 checks every call",
              1, 4096);
}

CommOptions options_from(const core::Config& c) {
    CommOptions o;
    o.backend = c.get_string("comm.backend");
    o.timeout_s = c.get_real("comm.timeout_s");
    o.bucket_mb = c.get_real("comm.bucket_mb");
    o.hierarchical = c.get_bool("comm.hierarchical");
    o.nodes_hint = int(c.get_int("comm.nodes_hint"));
    o.verify = c.get_bool("comm.verify");
    o.verify_first = int(c.get_int("comm.verify_first"));
    o.verify_every = int(c.get_int("comm.verify_every"));
    return o;
}

}  // namespace apiary::comm
