// The cluster simulator's event loop, the runs of jobs and their
// accounting (device time, lost work, cost, energy, CO2), node failures and
// spot capacity. Scheduling decisions are in scheduler.cc.

#include "sim/event_loop.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/rng.h"
#include "core/timing.h"

namespace apiary::sim {

Progress progress_at(double elapsed, double restart, double work_left, double interval,
                     double ckpt) {
    Progress p;
    if (elapsed <= restart) return p;
    const double x = elapsed - restart;
    if (interval <= 0) {  // free, continuous checkpoints: nothing is lost
        p.saved = std::min(x, work_left);
        return p;
    }
    if (interval >= work_left) {  // the run would end before its first checkpoint
        p.lost = std::min(x, work_left);
        return p;
    }
    const double cycles = std::floor(x / (interval + ckpt));
    p.saved = std::min(work_left, cycles * interval);
    p.lost = x - cycles * (interval + ckpt);
    return p;
}

double run_duration(double restart, double work_left, double interval, double ckpt) {
    // No checkpoint is written at the very end: the run is done.
    const double n_ckpt =
        interval > 0 && interval < work_left ? std::ceil(work_left / interval) - 1 : 0;
    return restart + work_left + n_ckpt * ckpt;
}

EventLoop::EventLoop(const std::vector<SimJob>& jobs, const SimConfig& cfg, const Policy& policy)
    : jobs_(jobs), cfg_(cfg), policy_(policy) {
    res_.policy = policy.name;
    res_.jobs.resize(jobs.size());
    run_.resize(jobs.size());
    pools_.emplace_back(0, cfg.nodes, cfg.per_node, true);
    pools_.emplace_back(cfg.nodes, cfg.spot_nodes_max, cfg.per_node, false);
    for (auto& p : pools_) p.set_leaf_nodes(cfg.nodes_per_leaf);
    running_.resize(2);
    const int total_nodes = cfg.nodes + cfg.spot_nodes_max;
    on_node_.resize(total_nodes);
    down_.assign(total_nodes, 0);
    reclaimed_.assign(total_nodes, 0);
    for (int n = cfg.nodes; n < total_nodes; ++n) reclaimed_[n] = 1;  // until the profile offers it
    failures_drawn_.assign(total_nodes, 0);
    // Dependencies (SWF's preceding job): on a job that runs here, else none.
    dep_.assign(jobs.size(), -1);
    waiters_.resize(jobs.size());
    std::map<std::string, int> index;  // built only when some job has a dependency
    for (size_t j = 0; j < jobs.size(); ++j) {
        if (jobs[j].spec.after.empty()) continue;
        if (index.empty()) {
            for (size_t k = 0; k < jobs.size(); ++k) index.emplace(jobs[k].spec.id, int(k));
        }
        const auto it = index.find(jobs[j].spec.after);
        if (it != index.end() && it->second != int(j) && jobs[size_t(it->second)].reject.empty()) {
            dep_[j] = it->second;
        }
    }
    for (size_t j = 0; j < jobs.size(); ++j) {
        run_[j].pool = jobs[j].spec.spot ? 1 : 0;
        if (!jobs[j].reject.empty()) {
            res_.jobs[j].state = JobState::rejected;
            continue;
        }
        ++remaining_;
        push(jobs[j].spec.submit + cfg.latency_s, EventKind::arrive, int(j));
    }
    if (cfg.mtbf_node_s > 0) {
        for (int n = 0; n < total_nodes; ++n) push(next_failure(n), EventKind::fail, n);
    }
    if (!cfg.spot_nodes.empty()) push(0, EventKind::spot, 0);
    if (policy.order == Order::multifactor) {
        // Shares normalised over every user (or account) in the trace.
        std::map<std::string, int> idx;
        share_idx_.resize(jobs.size());
        for (size_t j = 0; j < jobs.size(); ++j) {
            const auto [it, added] = idx.emplace(share_key(int(j)), int(idx.size()));
            if (added) share_names_.push_back(it->first);
            share_idx_[j] = it->second;
        }
        double total = 0;
        for (const auto& k : share_names_) {
            const auto it = cfg.shares.find(k);
            share_norm_.push_back(it == cfg.shares.end() ? 1.0 : it->second);
            total += share_norm_.back();
        }
        for (double& v : share_norm_) v /= total;
        for (const auto& k : share_names_) share_acct_.push_back(&accounts_[k]);
        fs_factor_.assign(share_names_.size(), 1.0);
    }
    for (size_t i = 0; i < cfg.capacity.size(); ++i) {
        push(cfg.capacity[i].t, EventKind::capacity, int(i));
    }
    last_point_ = SeriesPoint{0, 0, pools_[0].active_devices(), 0};
    if (cfg.record) res_.series.push_back(last_point_);
}

void EventLoop::push(double t, EventKind k, int a, int b) {
    events_.push(Event{t, k, seq_++, a, b});
}

double EventLoop::next_failure(int node) {
    // Exponential gaps drawn from counters, so every policy sees the same failures.
    const core::Philox rng(cfg_.seed, uint64_t(node));
    const double u = rng.uniform_f64(uint64_t(failures_drawn_[node]++));
    return now_ - std::log1p(-u) * cfg_.mtbf_node_s;
}

double EventLoop::estimate(int j) const {
    const double limit = jobs_[j].spec.time_limit;
    const Run& r = run_[j];
    return limit > 0 ? r.seg_start + limit : r.seg_end;
}

SimResult EventLoop::run() {
    const auto t0 = core::Clock::now();
    while (!events_.empty() && remaining_ > 0) {
        const double t = events_.top().t;
        if (t > cfg_.horizon_s) break;
        now_ = t;
        while (!events_.empty() && events_.top().t == t) {
            const Event e = events_.top();
            events_.pop();
            handle(e);
            ++res_.events;
        }
        schedule();
        record_series();
    }
    if (remaining_ > 0) {
        // Past the horizon (or nothing left that could start them).
        if (std::isfinite(cfg_.horizon_s)) now_ = std::max(now_, cfg_.horizon_s);
        for (size_t j = 0; j < run_.size(); ++j) {
            if (run_[j].state == RunState::running) close_segment(int(j), now_, false);
        }
        record_series();
    }
    for (const auto& o : res_.jobs) res_.makespan = std::max(res_.makespan, o.end);
    res_.wall_s = core::seconds_since(t0);
    return std::move(res_);
}

void EventLoop::handle(const Event& e) {
    switch (e.kind) {
        case EventKind::arrive:
            arrive(e.a);
            break;
        case EventKind::eligible:
            if (run_[e.a].state == RunState::held) enqueue(e.a);
            break;
        case EventKind::end:  // stale when the run was interrupted (epoch moved on)
            if (run_[e.a].state == RunState::running && run_[e.a].epoch == e.b) finish(e.a);
            break;
        case EventKind::release:
            if (run_[e.a].state == RunState::releasing && run_[e.a].epoch == e.b) {
                free_devices(e.a);
                run_[e.a].state = RunState::done;
            }
            break;
        case EventKind::fail:
            fail_node(e.a);
            break;
        case EventKind::repair:
            repair_node(e.a);
            break;
        case EventKind::spot:
            spot_step();
            break;
        case EventKind::capacity:
            capacity_step(e.a);
            break;
    }
}

void EventLoop::arrive(int j) {
    JobOutcome& o = res_.jobs[j];
    o.eligible = now_;
    if (const int d = dep_[size_t(j)]; d >= 0) {
        // Not before the job it follows has ended and the think time passed.
        const bool ended = run_[d].state == RunState::done || run_[d].state == RunState::releasing;
        if (!ended) {
            run_[j].state = RunState::held;
            waiters_[size_t(d)].push_back(j);
            return;
        }
        const double t = res_.jobs[d].end + jobs_[j].spec.think_s;
        if (t > now_) {
            run_[j].state = RunState::held;
            o.eligible = t;
            push(t, EventKind::eligible, j);
            return;
        }
    }
    if (policy_.carbon && jobs_[j].spec.flexible) {
        const double t = hold_until(j);
        if (t > now_) {
            run_[j].state = RunState::held;
            o.eligible = t;
            push(t, EventKind::eligible, j);
            return;
        }
    }
    enqueue(j);
}

void EventLoop::start(int j, std::vector<int32_t>&& slots) {
    const SimJob& job = jobs_[j];
    Run& r = run_[j];
    JobOutcome& o = res_.jobs[j];
    r.state = RunState::running;
    r.slots = std::move(slots);
    r.seg_start = now_;
    r.seg_restart = o.restarts > 0 ? cfg_.restart_s : 0;
    double dur = run_duration(r.seg_restart, job.cost.work_s - r.saved, job.cost.ckpt_interval_s,
                              job.cost.ckpt_s);
    const double limit = job.spec.time_limit;
    r.seg_timeout = limit > 0 && dur > limit;  // Slurm ends a job at its time limit
    if (r.seg_timeout) dur = limit;
    r.seg_end = now_ + dur;
    push(r.seg_end, EventKind::end, j, r.epoch);
    if (o.start < 0) o.start = now_;
    r.until = running_[r.pool].emplace(estimate(j) + cfg_.latency_s, j);
    const int per_node = cfg_.per_node;
    int prev = -1;
    for (int32_t s : r.slots) {  // an allocation holds each node's slots together
        if (s / per_node != prev) on_node_[prev = s / per_node].push_back(j);
    }
    if (cfg_.nodes_per_leaf > 0 && (long long)r.slots.size() >= per_node &&
        (long long)r.slots.size() <= (long long)cfg_.nodes_per_leaf * per_node) {
        ++res_.leaf_fit_runs;
        const auto [lo, hi] = std::minmax_element(r.slots.begin(), r.slots.end());
        const int leaf = cfg_.nodes_per_leaf * per_node;
        res_.leaf_split_runs += (*lo - pools_[r.pool].first_node() * per_node) / leaf !=
                                (*hi - pools_[r.pool].first_node() * per_node) / leaf;
    }
    busy_ += job.spec.devices;
    settle(share_key(j), double(job.spec.devices));
    count_running(j, +1);
}

void EventLoop::close_segment(int j, double end, bool completed) {
    const SimJob& job = jobs_[j];
    Run& r = run_[j];
    JobOutcome& o = res_.jobs[j];
    const double dur = end - r.seg_start;
    const double dev = double(job.spec.devices);
    o.device_s += dev * dur;
    o.energy_kwh += job.cost.power_kw * dur / 3600;
    o.co2_g += job.cost.power_kw * cfg_.carbon.integral(r.seg_start, end) / 3600;
    if (job.spec.spot) {
        const double usd_s = cfg_.spot_price.empty() ? cfg_.spot_price_hour * dur
                                                     : cfg_.spot_price.integral(r.seg_start, end);
        o.cost_usd += dev * usd_s / 3600;
    } else {
        o.cost_usd += dev * cfg_.price_hour * dur / 3600;
    }
    const double left = job.cost.work_s - r.saved;
    if (completed && !r.seg_timeout) {
        o.overhead_device_s += dev * (dur - left);
        r.saved = job.cost.work_s;
    } else {
        const Progress p =
            progress_at(dur, r.seg_restart, left, job.cost.ckpt_interval_s, job.cost.ckpt_s);
        r.saved += p.saved;
        o.lost_device_s += dev * p.lost;
        o.overhead_device_s += dev * (dur - p.saved - p.lost);
    }
    if (cfg_.record) {
        Segment s{j, r.seg_start, end, uint32_t(res_.slots.size()), uint32_t(r.slots.size())};
        res_.slots.insert(res_.slots.end(), r.slots.begin(), r.slots.end());
        res_.segments.push_back(s);
    }
}

void EventLoop::finish(int j) {
    Run& r = run_[j];
    JobOutcome& o = res_.jobs[j];
    close_segment(j, now_, true);
    o.end = now_;
    o.state = r.seg_timeout ? JobState::timeout : JobState::completed;
    --remaining_;
    settle(share_key(j), -double(jobs_[j].spec.devices));
    count_running(j, -1);
    for (int w : waiters_[size_t(j)]) {
        res_.jobs[w].eligible = now_ + jobs_[w].spec.think_s;
        push(res_.jobs[w].eligible, EventKind::eligible, w);
    }
    waiters_[size_t(j)].clear();
    if (cfg_.latency_s > 0) {  // e.g. Slurm's epilog and next tick: not free yet
        // No longer busy (utilisation counts jobs' time only), not yet free.
        busy_ -= (long long)r.slots.size();
        r.state = RunState::releasing;
        running_[r.pool].erase(r.until);
        r.until = running_[r.pool].emplace(now_ + cfg_.latency_s, j);
        push(now_ + cfg_.latency_s, EventKind::release, j, r.epoch);
    } else {
        free_devices(j);
        r.state = RunState::done;
    }
}

void EventLoop::free_devices(int j) {
    Run& r = run_[j];
    pools_[r.pool].release(r.slots.data(), r.slots.size());
    // A draining cluster takes the nodes this job leaves idle.
    for (size_t i = 0; drain_ > 0 && r.pool == 0 && i < r.slots.size(); ++i) {
        const int n = r.slots[i] / cfg_.per_node;
        if (!reclaimed_[n] && pools_[0].active(n) && pools_[0].free_on(n) == cfg_.per_node) {
            reclaimed_[n] = 1;
            pools_[0].deactivate(n);
            --drain_;
        }
    }
    if (r.state != RunState::releasing) busy_ -= (long long)r.slots.size();
    const int per_node = cfg_.per_node;
    int prev = -1;
    for (int32_t s : r.slots) {
        if (s / per_node == prev) continue;
        auto& v = on_node_[prev = s / per_node];
        v.erase(std::find(v.begin(), v.end(), j));
    }
    running_[r.pool].erase(r.until);
    r.slots.clear();
    r.slots.shrink_to_fit();
}

void EventLoop::interrupt(int j, bool failure) {
    Run& r = run_[j];
    JobOutcome& o = res_.jobs[j];
    close_segment(j, now_, false);
    settle(share_key(j), -double(jobs_[j].spec.devices));
    count_running(j, -1);
    free_devices(j);
    r.state = RunState::pending;  // queued again once the events of this time are handled
    ++r.epoch;
    ++o.restarts;
    ++(failure ? o.failures : o.preemptions);
    requeue_.push_back(j);
}

void EventLoop::kill_on_node(int node, bool failure) {
    const std::vector<int> victims = on_node_[node];
    for (int j : victims) {
        if (run_[j].state == RunState::running) interrupt(j, failure);
    }
}

void EventLoop::fail_node(int node) {
    if (down_[node] || reclaimed_[node]) {  // not ours while reclaimed: draw the next one
        push(next_failure(node), EventKind::fail, node);
        return;
    }
    down_[node] = 1;
    ++res_.node_failures;
    Pool& p = node < cfg_.nodes ? pools_[0] : pools_[1];
    p.deactivate(node);
    kill_on_node(node, true);
    push(now_ + cfg_.repair_s, EventKind::repair, node);
}

void EventLoop::repair_node(int node) {
    down_[node] = 0;
    if (!reclaimed_[node]) (node < cfg_.nodes ? pools_[0] : pools_[1]).activate(node);
    push(next_failure(node), EventKind::fail, node);
}

void EventLoop::spot_step() {
    const int first = cfg_.nodes, last = cfg_.nodes + cfg_.spot_nodes_max;
    const int target =
        std::clamp(int(std::floor(cfg_.spot_nodes.at(now_) + 1e-9)), 0, cfg_.spot_nodes_max);
    int offered = 0;
    for (int n = first; n < last; ++n) offered += !reclaimed_[n];
    if (target < offered) {
        // Reclaim failed nodes first, then idle ones, then the least busy.
        std::vector<int> order;
        for (int n = first; n < last; ++n) {
            if (!reclaimed_[n] && down_[n]) order.push_back(n);
        }
        for (int n : pools_[1].active_by_free()) order.push_back(n);
        for (int i = 0; i < offered - target && i < int(order.size()); ++i) {
            const int n = order[size_t(i)];
            reclaimed_[n] = 1;
            pools_[1].deactivate(n);
            kill_on_node(n, false);
            ++res_.spot_reclaims;
        }
    } else {
        for (int n = first; n < last && offered < target; ++n) {
            if (!reclaimed_[n]) continue;
            reclaimed_[n] = 0;
            if (!down_[n]) pools_[1].activate(n);
            ++offered;
        }
    }
    if (const double next = cfg_.spot_nodes.next_change(now_); std::isfinite(next)) {
        push(next, EventKind::spot, 0);
    }
}

void EventLoop::capacity_step(int i) {
    const CapacityStep& c = cfg_.capacity[size_t(i)];
    const long long target = std::clamp<long long>(c.nodes, 0, cfg_.nodes);
    long long offered = 0;  // nodes not taken by the capacity timeline (failed ones count)
    for (int n = 0; n < cfg_.nodes; ++n) offered += !reclaimed_[n];
    drain_ = 0;  // recomputed from the nodes still offered
    if (target < offered) {
        // Idle (and failed) nodes go at once; busy ones when their jobs end,
        // or now, stopping those jobs, when a node went down.
        std::vector<int> order;
        for (int n = 0; n < cfg_.nodes; ++n) {
            if (!reclaimed_[n] && down_[n]) order.push_back(n);
        }
        for (int n : pools_[0].active_by_free()) order.push_back(n);
        long long take = offered - target;
        for (size_t k = 0; k < order.size() && take > 0; ++k) {
            const int n = order[k];
            const bool idle = down_[n] || pools_[0].free_on(n) == cfg_.per_node;
            if (!idle && !c.hard) break;  // the rest are busy: they drain
            reclaimed_[n] = 1;
            pools_[0].deactivate(n);
            if (!idle) kill_on_node(n, true);
            --take;
        }
        drain_ = take;
    } else {
        for (int n = 0; n < cfg_.nodes && offered < target; ++n) {
            if (!reclaimed_[n]) continue;
            reclaimed_[n] = 0;
            if (!down_[n]) pools_[0].activate(n);
            ++offered;
        }
    }
}

void EventLoop::record_series() {
    // Integrate the state that held since the last point, then note the new one.
    const SeriesPoint& last = last_point_;
    const double dt = now_ - last.t;
    const double idle = double(std::max(0LL, last.available - last.busy));
    res_.busy_device_s += double(last.busy) * dt;
    res_.available_device_s += double(last.available) * dt;
    res_.fragmented_device_s += double(last_fragmented_) * dt;
    last_fragmented_ = pools_[0].fragmented() + pools_[1].fragmented();
    res_.idle_energy_kwh += idle * cfg_.idle_kw_per_device * dt / 3600;
    res_.idle_co2_g += idle * cfg_.idle_kw_per_device * cfg_.carbon.integral(last.t, now_) / 3600;
    const long long avail = pools_[0].active_devices() + pools_[1].active_devices();
    last_point_ = SeriesPoint{now_, busy_, avail, queued_};
    if (!cfg_.record) return;
    auto& s = res_.series;
    if (!s.empty() && s.back().busy == busy_ && s.back().available == avail &&
        s.back().queued == queued_) {
        return;
    }
    if (!s.empty() && s.back().t == now_) {
        s.back() = last_point_;
    } else {
        s.push_back(last_point_);
    }
}

SimResult simulate(const std::vector<SimJob>& jobs, const SimConfig& cfg, const Policy& policy) {
    EventLoop e(jobs, cfg, policy);
    return e.run();
}

}  // namespace apiary::sim
