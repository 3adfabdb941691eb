// A small SPMD program that misbehaves on purpose, run under mpirun by
// fault_test.cc: `comm_fault_driver <scenario>`. The last rank is the culprit.
//   ok             ten all-reduces, then exit 0
//   stall          the culprit sleeps far past comm.timeout_s before bucket 6
//   skip           the culprit skips bucket 5 (match check on)
//   skip_noverify  the same with comm.verify off: found at the final barrier
//   count          the culprit passes a different count for bucket 3
//   die            the culprit is killed (SIGKILL) before bucket 3
//   config         the culprit's config hash differs
//   throw          the culprit throws an IoError before bucket 4 (its own
//                  message must reach the user, not a watchdog report)
// The late_* scenarios make 400 calls with the default match check (every
// call among the first 256, then every 64th) and go wrong at call 300, where
// the check samples:
//   late_tag       the culprit all-reduces bucket 1 where the others reduce
//                  bucket 0 (same count: MPI runs it, the sums are garbage)
//   late_skip      the culprit skips call 300
//   late_count     the culprit passes 1025 elements at call 300

#include <fmt/core.h>

#include <csignal>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "comm/mpi_backend.h"
#include "core/error.h"

using namespace apiary;

int main(int argc, char** argv) {
    const std::string scenario = argc > 1 ? argv[1] : "ok";
    comm::CommOptions options;
    options.timeout_s = 2.0;
    options.verify = scenario != "skip_noverify";
    try {
        comm::MpiSession session(options);
        auto world = session.world();
        const bool culprit = world->rank() == world->size() - 1;
        comm::check_config_hash(*world, scenario == "config" && culprit ? 0xbad : 0x600d);
        std::vector<float> grads(1025, 1.0f);
        const bool late = scenario.rfind("late_", 0) == 0;
        for (int b = 0; b < (late ? 400 : 10); ++b) {
            int64_t count = 1024;
            int64_t bucket = late ? b % 20 : b;
            if (culprit && late && b == 300) {
                if (scenario == "late_tag") bucket += 1;
                if (scenario == "late_skip") continue;
                if (scenario == "late_count") count = 1025;
            }
            if (culprit && !late) {
                if (scenario == "stall" && b == 6)
                    std::this_thread::sleep_for(std::chrono::seconds(60));
                if (scenario.rfind("skip", 0) == 0 && b == 5) continue;
                if (scenario == "count" && b == 3) count = 1025;
                if (scenario == "die" && b == 3) std::raise(SIGKILL);
                if (scenario == "throw" && b == 4) {
                    throw IoError("shard_0007.bin: truncated at byte 4096 (rank's own error)");
                }
            }
            world
                ->all_reduce(grads.data(), count, core::DType::f32, comm::ReduceOp::avg,
                             comm::Tag{"bucket", bucket})
                ->wait();
        }
        world.reset();
    } catch (const Error& e) {
        std::fflush(stdout);
        fmt::print(stderr, "apiary: error: {}\n", e.what());
        comm::abort_mpi(1);
        return 1;
    }
    return 0;
}
