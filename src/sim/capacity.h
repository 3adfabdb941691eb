#pragma once
// Capacity over time: how many of the cluster's nodes jobs may use, as a
// step function. Read from CSV files (a timeline of available nodes;
// drain/down/resume events of named nodes; reservations), or inferred
// from a log's recorded starts and ends (`--capacity implied`). The
// simulator applies it to the on-demand pool: a drop takes idle nodes at
// once and busy ones as their jobs end (Slurm's DRAIN), except at a `down`
// event, which stops the jobs on the nodes it takes (Slurm's DOWN). Which
// nodes go is the simulator's choice (idle first); names are only counted.
// docs/sim.md "Capacity over time".

#include <iosfwd>
#include <string>
#include <vector>

#include "sim/trace.h"

namespace apiary::sim {

struct CapacityStep {
    double t = 0;         // seconds from the trace's t = 0
    long long nodes = 0;  // available from t until the next step
    bool hard = false;    // a node went down: running jobs on the nodes taken stop
};

// The inputs, merged into one timeline by `capacity_timeline`.
struct CapacityInput {
    struct Level {
        double t;
        long long nodes;
    };
    struct NodeEvent {
        double t;
        int kind;  // 0 drain, 1 down, 2 resume
        std::vector<std::string> nodes;
        std::string where;
    };
    struct Reservation {
        double start, end;
        long long nodes;
    };
    std::vector<Level> levels;  // time,available_nodes
    std::vector<NodeEvent> events;
    std::vector<Reservation> reservations;
};

// Reads one CSV; its header says which kind: "time,available_nodes",
// "time,event,nodes" (event drain / down / resume, nodes a name or a Slurm
// hostlist such as nid[0010-0019]) or "start,end,nodes" (a reservation).
// Errors name the file, line and field.
// Also reads Slurm's own node events, `sacctmgr show event --parsable2
// format=NodeName,TimeStart,TimeEnd,State` (other fields ignored; a State
// with DOWN is down, any other drain; an end resumes the nodes; events
// without nodes are skipped), their times less `origin_epoch` (the trace's
// t = 0 in Unix seconds).
void read_capacity_csv(const std::string& path, CapacityInput& in, double origin_epoch = 0);
void parse_capacity_csv(const std::string& text, const std::string& source, CapacityInput& in,
                        double origin_epoch = 0);

// The merged timeline for a cluster of `nodes`: min(level, nodes) less the
// named nodes out and the reserved nodes, never below 0. The first step is
// at t = 0.
std::vector<CapacityStep> capacity_timeline(const CapacityInput& in, long long nodes);

// The capacity a log implies (jobs with recorded starts and ends): the
// running total of recorded allocations is a lower bound, and an interval of
// at least `min_gap_s` in which a queued job would fit in the free nodes but
// nothing starts is taken as an outage, its capacity what was running.
// Elsewhere the full `nodes`. `outages` (if given) gets how many there were.
std::vector<CapacityStep> implied_capacity(const Trace& trace, long long nodes, double min_gap_s,
                                           int* outages = nullptr);

// "time,available_nodes" rows, one a change.
void write_capacity_csv(const std::vector<CapacityStep>& steps, std::ostream& out);

}  // namespace apiary::sim
