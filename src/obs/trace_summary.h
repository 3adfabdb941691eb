#pragma once
// Where the traced steps' time went, from the ranks' trace files. On the
// thread that runs the step, every instant inside a step span belongs to
// exactly one part, that of the innermost span covering it:
//   exposed comm  under a collective or a wait for one (tensor-parallel,
//                 pipeline, data-parallel, the step's scalars)
//   eval, checkpoint   under an evaluation or a save
//   compute, data wait, optimizer   the span's own kind
//   idle          in the step span itself, outside every other span
// so the parts add up to the step time. "comm" counts every collective
// that started inside a step on any thread (hidden behind compute or not);
// comm / compute is the communication-to-compute ratio. Layers get the
// compute and exposed comm inside their forward and backward spans, and
// the collectives that started while they ran.

#include <string>
#include <vector>

#include "obs/trace_file.h"

namespace apiary::obs {

struct PhaseSplit {
    int steps = 0;
    double step = 0, compute = 0, exposed_comm = 0, data_wait = 0, optimizer = 0, checkpoint = 0,
           eval = 0, idle = 0;
    double comm = 0;  // every collective's time, hidden or not
    double parts() const {
        return compute + exposed_comm + data_wait + optimizer + checkpoint + eval + idle;
    }
};

struct LayerSplit {
    std::string name;  // "embedding", "block 3", "head"
    int order = 0;
    int ranks = 0;                                   // ranks that run it
    double compute = 0, exposed_comm = 0, comm = 0;  // seconds per step, mean over those ranks
};

// The busiest rank against the least busy one, busy being a step less its
// exposed communication (the time a rank did not wait on the others; as
// the apiary_straggler_ratio gauge counts it). Only with 2 ranks or more.
struct Straggler {
    int rank = -1, fastest_rank = -1;
    std::string host, fastest_host;     // "" when the traces do not say
    double busy = 0, fastest_busy = 0;  // seconds per step
    double ratio() const { return fastest_busy > 0 ? busy / fastest_busy : 0; }
};

struct TraceSummary {
    int64_t first_step = 0, last_step = 0;
    std::vector<std::pair<int, PhaseSplit>> ranks;  // (rank, seconds per step)
    std::vector<std::string> hosts;                 // of ranks[i]
    std::vector<LayerSplit> layers;
    Straggler straggler;  // rank -1: one rank
};

TraceSummary summarize(const std::vector<RankTrace>& ranks);

// The summary as text tables and as JSON (for scripts and tests).
std::string format_summary(const TraceSummary& s);
std::string summary_json(const TraceSummary& s);

}  // namespace apiary::obs
