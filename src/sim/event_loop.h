#pragma once
// The cluster simulator's state and event loop (event_loop.cc: events, runs and
// their accounting; scheduler.cc: queues, scheduling passes, backfill,
// preemption, fair share and carbon-aware holds). Internal to sim/.

#include <deque>
#include <map>
#include <queue>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "sim/cluster_sim.h"
#include "sim/pool.h"

namespace apiary::sim {

// Same-time events run in this order: devices come back before anything
// asks for them, and arrivals come last so one pass sees them all.
enum class EventKind { release, end, repair, fail, spot, capacity, arrive, eligible };

struct Event {
    double t;
    EventKind kind;
    int64_t seq;
    int a;  // job or node
    int b;  // epoch of a job's run
    bool operator>(const Event& o) const {
        if (t != o.t) return t > o.t;
        if (kind != o.kind) return kind > o.kind;
        return seq > o.seq;
    }
};

enum class RunState { pending, held, queued, running, releasing, done };

struct Run {  // a job's state during the simulation
    RunState state = RunState::pending;
    int epoch = 0;  // bumped when a run is interrupted: its end event is stale
    int token = 0;  // bumped on each enqueue: older queue entries are stale
    int pool = 0;
    double saved = 0;  // work saved in checkpoints
    double seg_start = 0, seg_restart = 0, seg_end = 0;
    bool seg_timeout = false;
    std::vector<int32_t> slots;
    std::multiset<std::pair<double, int>>::iterator until;  // in the pool's running set
};

struct QueueEntry {
    int job;
    int token;
};

struct Account {
    double usage = 0;  // decayed device-seconds at time t
    double rate = 0;   // devices running now
    double t = 0;
};

class EventLoop {
  public:
    EventLoop(const std::vector<SimJob>& jobs, const SimConfig& cfg, const Policy& policy);
    SimResult run();

  private:
    // event_loop.cc
    void push(double t, EventKind k, int a, int b = 0);
    void handle(const Event& e);
    void arrive(int j);
    void start(int j, std::vector<int32_t>&& slots);
    void finish(int j);
    void interrupt(int j, bool failure);
    void free_devices(int j);
    void close_segment(int j, double end, bool completed);
    void fail_node(int node);
    void repair_node(int node);
    void spot_step();
    void capacity_step(int i);  // cfg_.capacity[i] takes effect
    void kill_on_node(int node, bool failure);
    void record_series();
    double next_failure(int node);
    double estimate(int j) const;  // when its devices are expected back (backfill)
    Pool& pool_of(int j) { return pools_[run_[j].pool]; }

    // scheduler.cc
    void enqueue(int j);
    void schedule();
    bool pass();                       // true when it preempted (another pass may start more)
    void pass_conservative(int pool);  // backfill with several reservations
    template <class Visit>
    void for_each_queued(int pool, Visit visit);  // in policy order until visit returns false
    void try_start(int j);
    double planned_run(int j) const;  // what the scheduler expects the next run to take
    void reserve(int j, double* shadow, long long* extra);
    bool preempt_for(int j);
    double hold_until(int j) const;  // carbon-aware start
    void settle(const std::string& account, double delta_devices);
    void settle(Account& a, double delta_devices);
    double usage_per_share(const std::string& account);
    const std::string& share_key(int j) const;  // whose usage a job adds to
    double priority_of(int j) const;            // multifactor, with fs_factor_ of now
    bool within_limits(int j) const;            // its user's and account's running jobs and nodes
    void count_running(int j, int sign);
    void compact_queues();

    const std::vector<SimJob>& jobs_;
    const SimConfig& cfg_;
    const Policy& policy_;
    SimResult res_;
    double now_ = 0;
    std::vector<Run> run_;
    std::vector<Pool> pools_;
    std::vector<std::multiset<std::pair<double, int>>> running_;  // per pool: (devices back, job)
    std::vector<std::vector<int>> on_node_;                       // jobs holding devices on a node
    std::vector<char> down_, reclaimed_;
    std::vector<long long> failures_drawn_;
    std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events_;
    int64_t seq_ = 0;
    long long remaining_ = 0;  // jobs not yet done
    long long queued_ = 0;
    long long busy_ = 0;
    // Queues per pool (on-demand, spot; pools never block each other):
    // class -> account -> entries in submit order ("" and class 0 when the
    // policy does not use them).
    using Queues = std::map<int, std::map<std::string, std::deque<QueueEntry>>, std::greater<int>>;
    Queues queues_[2];
    std::vector<int> requeue_;               // interrupted during a pass, queued after it
    std::vector<int> dep_;                   // the job each job waits for (-1: none)
    std::vector<std::vector<int>> waiters_;  // jobs held until this one ends
    std::map<std::string, Account> accounts_;
    int tombstones_ = 0;
    long long drain_ = 0;  // on-demand nodes still to leave as their jobs end
    struct Use {
        long long jobs = 0, nodes = 0;
    };
    std::map<std::string, Use> user_use_, account_use_;  // only with limits
    // Multifactor: each job's fair-share key (an index into share_names_),
    // the keys' normalised shares, and per pool the queue in priority order
    // as last computed (at mf_t_) plus the jobs queued since.
    struct Ranked {
        double prio;
        int job, token;
    };
    std::vector<int> share_idx_;
    std::vector<std::string> share_names_;
    std::vector<Account*> share_acct_;  // into accounts_ (a map: stable addresses)
    std::vector<double> share_norm_, fs_factor_;
    std::vector<Ranked> mf_order_[2];
    std::vector<QueueEntry> mf_new_[2];
    double mf_t_[2] = {-kNever, -kNever};
    void rank(int pool);       // rank_all every PriorityCalcPeriod, else rank_new
    void rank_all(int pool);   // recompute every queued job's priority
    void rank_new(int pool);   // place the jobs queued since
    void fairshare_factors();  // fs_factor_ of every key, now
    SeriesPoint last_point_;
    long long last_fragmented_ = 0;  // free devices on partly busy nodes at last_point_
};

}  // namespace apiary::sim
