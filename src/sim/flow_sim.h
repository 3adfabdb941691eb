#pragma once
// A flow-level discrete-event simulation of collectives on a fabric. Each
// job is a sequence of steps; a step waits its latency (alpha), then sends
// all its transfers at once, and ends when the last one arrives. Flows that
// share a link share its bandwidth max-min fairly (progressive filling,
// Bertsekas & Gallager, Data Networks, 6.5.2), recomputed whenever a flow
// starts or ends. Time advances from event to event.

#include <string>
#include <vector>

#include "sim/fabric.h"

namespace apiary::sim {

struct Transfer {
    long long src = 0, dst = 0;
    double bytes = 0;
};

struct Step {
    double latency = 0;  // before the transfers start (alpha, or alpha x depth for a tree)
    std::vector<Transfer> transfers;
    long long times = 1;  // the step runs this many times in a row (a ring's 2(n-1) steps)
};

struct FlowStats {
    std::vector<double> finish_s;  // per job: when its last step ended
    long long events = 0;          // rate recomputations
    long long flows = 0;
    // The busiest link: the largest fraction of its capacity in use, time-averaged
    // over the run, and its name.
    double hottest_link_util = 0;
    std::string hottest_link;
    // The switch link (uplink, global link) with the highest load at any
    // moment, as a fraction of its capacity.
    double hottest_switch_peak = 0;
    std::string hottest_switch;
};

// Runs every job's steps from time 0, all jobs at once on one fabric.
FlowStats simulate_flows(const Fabric& fabric, const std::vector<std::vector<Step>>& jobs);

}  // namespace apiary::sim
