// Scheduling decisions of the cluster simulator: the queues (submit order,
// priority classes, fair share between accounts), the scheduling pass with
// EASY backfill, preemption of lower classes, and carbon-aware holds.

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string_view>
#include <unordered_map>

#include "core/error.h"
#include "sim/event_loop.h"

namespace apiary::sim {

namespace {
const std::string kNoAccount;
}

void EventLoop::enqueue(int j) {
    Run& r = run_[j];
    r.state = RunState::queued;
    ++r.token;
    ++queued_;
    const JobSpec& s = jobs_[j].spec;
    const bool classes = policy_.order == Order::priority || policy_.order == Order::fairshare;
    const int cls = classes ? s.priority : 0;
    const std::string& acct = policy_.order == Order::fairshare ? s.account : kNoAccount;
    if (policy_.order == Order::multifactor) {  // ranked at the next pass
        mf_new_[r.pool].push_back(QueueEntry{j, r.token});
        return;
    }
    auto& q = queues_[r.pool][cls][acct];
    // Submit order, the trace's order breaking ties (Slurm's priority/basic
    // orders by submission too, and a requeued job keeps its place).
    auto before = [&](const QueueEntry& e, int k) {
        const double a = jobs_[e.job].spec.submit, b = jobs_[k].spec.submit;
        return a < b || (a == b && e.job < k);
    };
    if (q.empty() || before(q.back(), j)) {
        q.push_back(QueueEntry{j, r.token});
    } else {
        auto it = std::lower_bound(q.begin(), q.end(), j, before);
        q.insert(it, QueueEntry{j, r.token});
    }
}

void EventLoop::settle(const std::string& account, double delta_devices) {
    settle(accounts_[account], delta_devices);
}

void EventLoop::settle(Account& a, double delta_devices) {
    const double dt = now_ - a.t;
    if (cfg_.fairshare_half_life_s > 0) {
        // Usage decays with the half-life while running devices add to it:
        // the closed form of dU/dt = rate - lambda U over dt.
        const double lambda = std::log(2.0) / cfg_.fairshare_half_life_s;
        const double decay = std::exp(-lambda * dt);
        a.usage = a.usage * decay + a.rate * (1 - decay) / lambda;
    } else {
        a.usage += a.rate * dt;
    }
    a.t = now_;
    a.rate += delta_devices;
}

double EventLoop::usage_per_share(const std::string& account) {
    settle(account, 0);
    auto it = cfg_.shares.find(account);
    const double share = it == cfg_.shares.end() ? 1.0 : it->second;
    return accounts_[account].usage / share;
}

void EventLoop::schedule() {
    for (int j : requeue_) enqueue(j);
    requeue_.clear();
    if (queued_ == 0) return;
    // A preemption may leave room for more than the job it was for: pass again.
    for (int i = 0; i < 4 && pass(); ++i) {
        for (int j : requeue_) enqueue(j);
        requeue_.clear();
    }
    for (int j : requeue_) enqueue(j);
    requeue_.clear();
    compact_queues();
}

double EventLoop::hold_until(int j) const {
    const SimJob& job = jobs_[j];
    const double d = planned_run(j);
    const double latest = job.spec.deadline - d;
    const Profile& c = cfg_.carbon;
    if (latest <= now_ || c.values().size() <= 1) return now_;
    // CO2 of a start at t is power x the integral of intensity over [t, t + d]:
    // piecewise linear in t, so its minimum is at a window end or where t or
    // t + d crosses a step. The profile repeats, so one period is enough.
    const double last = std::min(latest, now_ + c.period_s());
    std::vector<double> cand = {now_, last};
    for (double b = c.next_change(now_); b <= last + d; b = c.next_change(b)) {
        if (b <= last) cand.push_back(b);
        if (b - d > now_ && b - d <= last) cand.push_back(b - d);
    }
    std::sort(cand.begin(), cand.end());
    double best = now_, best_g = c.integral(now_, now_ + d);
    for (double t : cand) {
        const double g = c.integral(t, t + d);
        if (g < best_g * (1 - 1e-9)) best = t, best_g = g;
    }
    return best;
}

double EventLoop::planned_run(int j) const {
    const SimJob& job = jobs_[j];
    const double restart = res_.jobs[j].restarts > 0 ? cfg_.restart_s : 0;
    const double dur = run_duration(restart, job.cost.work_s - run_[j].saved,
                                    job.cost.ckpt_interval_s, job.cost.ckpt_s);
    // What the scheduler is told: the time limit when the user gave one.
    return job.spec.time_limit > 0 ? job.spec.time_limit : dur;
}

void EventLoop::reserve(int j, double* shadow, long long* extra) {
    // The earliest time enough devices are back, by the running jobs' estimates.
    const int pool = run_[j].pool;
    const long long need = jobs_[j].spec.devices;
    // Nodes still to drain will not come back to the queue.
    long long avail = pools_[pool].free() - (pool == 0 ? drain_ * cfg_.per_node : 0);
    for (const auto& [t, k] : running_[pool]) {
        avail += (long long)run_[k].slots.size();
        if (avail >= need) {
            *shadow = t;
            *extra = avail - need;
            return;
        }
    }
    *shadow = kNever;  // not even when everything ends (nodes down): anything may go first
    *extra = 0;
}

bool EventLoop::preempt_for(int j) {
    const int pool = run_[j].pool;
    const int cls = jobs_[j].spec.priority;
    const long long need = jobs_[j].spec.devices - pools_[pool].free();
    std::vector<int> victims;
    for (const auto& [t, k] : running_[pool]) {
        if (run_[k].state == RunState::running && jobs_[k].spec.priority < cls) {
            victims.push_back(k);
        }
    }
    // Lowest class first; within it the latest started, which has least to lose.
    std::sort(victims.begin(), victims.end(), [&](int a, int b) {
        const int pa = jobs_[a].spec.priority, pb = jobs_[b].spec.priority;
        if (pa != pb) return pa < pb;
        return run_[a].seg_start > run_[b].seg_start;
    });
    long long got = 0;
    size_t n = 0;
    for (; n < victims.size() && got < need; ++n) got += jobs_[victims[n]].spec.devices;
    if (got < need) return false;
    for (size_t i = 0; i < n; ++i) interrupt(victims[i], false);
    return true;
}

void EventLoop::try_start(int j) {
    std::vector<int32_t> slots;
    const bool ok = pools_[run_[j].pool].allocate(jobs_[j].spec.devices, slots);
    APIARY_CHECK(ok, "job {} needs {} devices, {} free", jobs_[j].spec.id, jobs_[j].spec.devices,
                 pools_[run_[j].pool].free());
    --queued_;
    ++tombstones_;  // its queue entry is stale now
    start(j, std::move(slots));
}

const std::string& EventLoop::share_key(int j) const {
    const JobSpec& s = jobs_[j].spec;
    return policy_.order == Order::multifactor && !s.user.empty() ? s.user : s.account;
}

void EventLoop::count_running(int j, int sign) {
    if (cfg_.limits.empty()) return;
    const JobSpec& s = jobs_[j].spec;
    const long long nodes = (s.devices + cfg_.per_node - 1) / cfg_.per_node;
    for (auto* u : {&user_use_[s.user], &account_use_[s.account]}) {
        u->jobs += sign;
        u->nodes += sign * nodes;
    }
}

bool EventLoop::within_limits(int j) const {
    if (cfg_.limits.empty()) return true;
    const JobSpec& s = jobs_[j].spec;
    const long long nodes = (s.devices + cfg_.per_node - 1) / cfg_.per_node;
    auto ok = [&](const std::map<std::string, Limit>& lim, const std::map<std::string, Use>& use,
                  const std::string& name) {
        auto l = lim.find(name);
        if (l == lim.end()) l = lim.find("*");
        if (l == lim.end()) return true;
        const auto u = use.find(name);
        const Use now = u == use.end() ? Use{} : u->second;
        if (l->second.max_jobs >= 0 && now.jobs + 1 > l->second.max_jobs) return false;
        return l->second.max_nodes < 0 || now.nodes + nodes <= l->second.max_nodes;
    };
    return ok(cfg_.limits.user, user_use_, s.user) &&
           ok(cfg_.limits.account, account_use_, s.account);
}

void EventLoop::fairshare_factors() {
    // Classic fair share: 2^(-normalised usage / normalised shares).
    if (cfg_.weight_fairshare == 0 || policy_.wfp) return;  // not used
    double total = 0;
    for (Account* a : share_acct_) {
        settle(*a, 0);
        total += a->usage;
    }
    for (size_t i = 0; i < share_acct_.size(); ++i) {
        const double u = total > 0 ? share_acct_[i]->usage / total : 0;
        fs_factor_[i] = std::exp2(-u / share_norm_[i]);
    }
}

double EventLoop::priority_of(int j) const {
    // Slurm's priority/multifactor (slurm.conf PriorityWeight*, the
    // "Multifactor Priority Plugin" page): each factor in [0, 1].
    const JobSpec& s = jobs_[j].spec;
    const double age = now_ - res_.jobs[j].eligible;
    if (policy_.wfp) {
        // Cobalt's WFP: (queued / requested walltime)^3 x nodes.
        const double x = age / std::max(1.0, planned_run(j));
        return x * x * x * double((s.devices + cfg_.per_node - 1) / cfg_.per_node);
    }
    const double age_f =
        cfg_.priority_max_age_s > 0 ? std::min(1.0, age / cfg_.priority_max_age_s) : 1.0;
    // Job size: the share of the cluster it asks for (PriorityFavorSmall=NO),
    // or what it leaves (PriorityFavorSmall=YES).
    const double share = std::min(1.0, double(s.devices) / double(std::max(1LL, cfg_.devices())));
    const double size_f = cfg_.favor_small ? 1 - share : share;
    return cfg_.weight_age * age_f + cfg_.weight_size * size_f +
           cfg_.weight_fairshare * fs_factor_[size_t(share_idx_[j])];
}

namespace {
// Highest priority first, then submission, then the trace's order.
template <class Jobs>
auto ranked_before(const Jobs& jobs) {
    return [&jobs](const auto& a, const auto& b) {
        if (a.prio != b.prio) return a.prio > b.prio;
        const double sa = jobs[a.job].spec.submit, sb = jobs[b.job].spec.submit;
        return sa < sb || (sa == sb && a.job < b.job);
    };
}
}  // namespace

void EventLoop::rank_all(int pool) {
    fairshare_factors();
    std::vector<Ranked> next;
    auto keep = [&](int j, int token) {
        if (run_[j].state == RunState::queued && run_[j].token == token) {
            next.push_back(Ranked{priority_of(j), j, token});
        }
    };
    for (const Ranked& r : mf_order_[pool]) keep(r.job, r.token);
    for (const QueueEntry& e : mf_new_[pool]) keep(e.job, e.token);
    std::sort(next.begin(), next.end(), ranked_before(jobs_));
    mf_order_[pool] = std::move(next);
    mf_new_[pool].clear();
    mf_t_[pool] = now_;
}

void EventLoop::rank_new(int pool) {
    // A job queued between recalculations gets its priority when it is
    // queued, as Slurm gives a new job its priority at submission.
    if (mf_new_[pool].empty()) return;
    fairshare_factors();
    auto& v = mf_order_[pool];
    const auto before = ranked_before(jobs_);
    for (const QueueEntry& e : mf_new_[pool]) {
        if (run_[e.job].state != RunState::queued || run_[e.job].token != e.token) continue;
        const Ranked r{priority_of(e.job), e.job, e.token};
        v.insert(std::upper_bound(v.begin(), v.end(), r, before), r);
    }
    mf_new_[pool].clear();
}

void EventLoop::rank(int pool) {
    // Priorities as of the last recalculation (PriorityCalcPeriod).
    if (now_ - mf_t_[pool] >= cfg_.priority_calc_period_s) {
        rank_all(pool);
    } else {
        rank_new(pool);
    }
}

template <class Visit>
void EventLoop::for_each_queued(int pool, Visit visit) {
    if (policy_.order == Order::multifactor) {
        rank(pool);
        for (const Ranked& r : mf_order_[pool]) {
            if (run_[r.job].state != RunState::queued || run_[r.job].token != r.token) continue;
            if (!visit(r.job)) return;
        }
        return;
    }
    std::vector<std::pair<double, const std::string*>> order;
    for (auto& [cls, accounts] : queues_[pool]) {
        order.clear();
        for (auto& [name, q] : accounts) {
            while (!q.empty() && (run_[q.front().job].state != RunState::queued ||
                                  run_[q.front().job].token != q.front().token)) {
                q.pop_front();
                --tombstones_;
            }
            if (q.empty()) continue;
            const double key = policy_.order == Order::fairshare ? usage_per_share(name) : 0;
            order.emplace_back(key, &name);
        }
        std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
            return a.first < b.first || (a.first == b.first && *a.second < *b.second);
        });
        for (const auto& [_, name] : order) {
            // Starting a job only makes its entry stale; nothing is inserted
            // or erased while a pass runs (requeues wait in requeue_).
            for (const QueueEntry& e : accounts[*name]) {
                const Run& r = run_[e.job];
                if (r.state != RunState::queued || r.token != e.token) continue;
                if (!visit(e.job)) return;
            }
        }
    }
}

namespace {

// Free devices over time as the scheduler plans it: steps (t, free from t
// until the next step), the last one for ever.
struct FreeProfile {
    std::vector<std::pair<double, long long>> steps;

    // The earliest start >= steps[0].t at which `need` devices are free for `dur`.
    double earliest(long long need, double dur) const {
        size_t i = 0;
        while (i < steps.size()) {
            if (steps[i].second < need) {
                ++i;
                continue;
            }
            const double start = steps[i].first;
            size_t k = i + 1;
            while (k < steps.size() && steps[k].first < start + dur && steps[k].second >= need) ++k;
            if (k == steps.size() || steps[k].first >= start + dur) return start;
            i = k + 1;  // steps[k] is too low: no start before its end fits
        }
        return kNever;
    }
    // Whether `need` devices are free from the first step for `dur`.
    bool fits_first(long long need, double dur) const {
        const double end = steps[0].first + dur;
        for (size_t k = 0; k < steps.size() && steps[k].first < end; ++k) {
            if (steps[k].second < need) return false;
        }
        return true;
    }
    size_t split(double t) {  // index of the step starting at t (made if needed)
        auto it = std::lower_bound(steps.begin(), steps.end(), t,
                                   [](const auto& s, double x) { return s.first < x; });
        if (it != steps.end() && it->first == t) return size_t(it - steps.begin());
        const long long f = std::prev(it)->second;
        const auto at = steps.insert(it, {t, f});  // before begin(): insert may reallocate
        return size_t(at - steps.begin());
    }
    void take(long long need, double from, double to) {
        const size_t a = split(from);
        const size_t b = std::isfinite(to) ? split(to) : steps.size();
        for (size_t i = a; i < b; ++i) steps[i].second -= need;
    }
};

}  // namespace

void EventLoop::pass_conservative(int pool) {
    // Slurm's sched/backfill: the first bf_max_job_test jobs in order that
    // cannot start now get reservations (within bf_window); any job may start
    // now if it delays none of them (Mu'alem & Feitelson 2001, "conservative
    // backfilling" when the depth covers the queue).
    if (pools_[pool].free() <= 0) {                           // nothing can start: nothing to plan
        if (policy_.order == Order::multifactor) rank(pool);  // new jobs ranked when queued
        return;
    }
    FreeProfile p;  // made when a job that might start now needs it
    auto make_profile = [&] {
        if (!p.steps.empty()) return;
        p.steps.emplace_back(now_, pools_[pool].free() - (pool == 0 ? drain_ * cfg_.per_node : 0));
        for (const auto& [t, k] : running_[pool]) {
            const long long n = (long long)run_[k].slots.size();
            if (t <= now_ || p.steps.back().first == t) {
                p.steps.back().second += n;
            } else {
                p.steps.emplace_back(t, p.steps.back().second + n);
            }
        }
    };
    // Reservations are planned only when a job that might start now needs
    // them: most passes start nothing, and then none is computed.
    int seen = 0, reserved = 0;
    std::vector<int> unplanned;                        // jobs owed a reservation, in order
    std::unordered_map<std::string_view, int> tested;  // bf_max_job_user
    bool in_order = true;                              // the main scheduler's part
    auto plan = [&] {
        make_profile();
        for (int k : unplanned) {
            const long long n = jobs_[k].spec.devices;
            const double d = planned_run(k) + cfg_.latency_s;
            const double at = p.earliest(n, d);
            if (!std::isfinite(at) || at - now_ > cfg_.bf_window_s) continue;
            p.take(n, at, at + d);
            if (res_.jobs[k].reservation < 0) res_.jobs[k].reservation = at;
        }
        unplanned.clear();
    };
    for_each_queued(pool, [&](int j) {
        if (++seen > cfg_.queue_depth) return false;
        if (!within_limits(j)) return true;
        const long long need = jobs_[j].spec.devices;
        if (!in_order && cfg_.bf_max_job_user > 0 &&
            ++tested[jobs_[j].spec.user] > cfg_.bf_max_job_user) {
            return true;
        }
        if (need > pools_[pool].free()) {  // cannot start now: it may reserve
            in_order = false;
            if (reserved < cfg_.bf_max_job_test) {
                unplanned.push_back(j);
                ++reserved;
            }
            return pools_[pool].free() > 0;
        }
        plan();
        const double dur = planned_run(j) + cfg_.latency_s;
        if (p.fits_first(need, dur)) {
            try_start(j);
            p.take(need, now_, now_ + dur);
            return true;
        }
        if (reserved >= cfg_.bf_max_job_test) return pools_[pool].free() > 0;
        const double at = p.earliest(need, dur);
        if (at <= now_) {
            try_start(j);
            p.take(need, now_, now_ + dur);
        } else if (reserved < cfg_.bf_max_job_test && at - now_ <= cfg_.bf_window_s &&
                   std::isfinite(at)) {
            p.take(need, at, at + dur);
            ++reserved;
            if (res_.jobs[j].reservation < 0) res_.jobs[j].reservation = at;
        }
        return pools_[pool].free() > 0;
    });
}

bool EventLoop::pass() {
    bool preempted = false;
    for (int pool = 0; pool < 2; ++pool) {
        if (policy_.backfill && !policy_.preempt && cfg_.bf_max_job_test > 1) {
            pass_conservative(pool);
            continue;
        }
        bool blocked = false;
        double shadow = kNever;
        long long extra = 0;
        int seen = 0;
        std::unordered_map<std::string_view, int> tested;  // bf_max_job_user
        for_each_queued(pool, [&](int j) {
            if (++seen > cfg_.queue_depth) return false;
            const long long need = jobs_[j].spec.devices;
            const long long free = pools_[pool].free();
            // Held by its user's or account's limit: it waits, the others pass
            // it (Slurm's AssocMaxJobsLimit / AssocGrpNodeLimit reasons).
            if (!within_limits(j)) return true;
            if (blocked) {
                if (cfg_.bf_max_job_user > 0 &&
                    ++tested[jobs_[j].spec.user] > cfg_.bf_max_job_user) {
                    return true;  // this user's backfill tests are used up
                }
                // EASY: it may go now if it is back before the reservation,
                // or fits in what the reserved job leaves spare.
                if (free >= need) {
                    if (now_ + planned_run(j) + cfg_.latency_s <= shadow) {
                        try_start(j);
                    } else if (need <= extra) {
                        try_start(j);
                        extra -= need;
                    }
                }
                return free > 0;
            }
            if (free >= need) {
                try_start(j);
                return true;
            }
            if (policy_.preempt && preempt_for(j)) {
                try_start(j);
                preempted = true;
                return true;
            }
            blocked = true;  // the first job that cannot start: it blocks, or reserves
            if (!policy_.backfill) return false;
            reserve(j, &shadow, &extra);
            if (res_.jobs[j].reservation < 0) res_.jobs[j].reservation = shadow;
            return free > 0;
        });
    }
    return preempted;
}

void EventLoop::compact_queues() {
    if (tombstones_ < 4096 || tombstones_ < queued_) return;
    for (auto& pool : queues_) {
        for (auto& [cls, accounts] : pool) {
            for (auto& [name, q] : accounts) {
                std::erase_if(q, [&](const QueueEntry& e) {
                    return run_[e.job].state != RunState::queued || run_[e.job].token != e.token;
                });
            }
        }
    }
    tombstones_ = 0;
}

}  // namespace apiary::sim
