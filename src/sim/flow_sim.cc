#include "sim/flow_sim.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <queue>

#include "core/error.h"

namespace apiary::sim {

namespace {

struct Flow {
    int job;
    int path_begin, path_len;  // into Sim::paths
    double left;               // bytes
    double rate = 0;           // bytes/s
};

class Sim {
  public:
    Sim(const Fabric& f, const std::vector<std::vector<Step>>& jobs)
        : f_(f),
          jobs_(jobs),
          cap_left_(f.links()),
          users_(f.links(), 0),
          bytes_(f.links(), 0),
          peak_(f.links(), 0) {
        stats_.finish_s.assign(jobs.size(), 0);
        next_step_.assign(jobs.size(), 0);
        done_times_.assign(jobs.size(), 0);
        open_.assign(jobs.size(), 0);
    }

    FlowStats run() {
        for (size_t j = 0; j < jobs_.size(); ++j) begin_step(int(j));
        while (!flows_.empty() || !waiting_.empty()) {
            if (dirty_) rates();
            double t_done = kInf;
            for (const Flow& fl : flows_) t_done = std::min(t_done, now_ + fl.left / fl.rate);
            const double t_start = waiting_.empty() ? kInf : waiting_.top().first;
            const double t = std::min(t_done, t_start);
            advance(t);
            // Flows of one step end together in exact arithmetic; finish
            // those within rounding of the earliest in the same event.
            const double eps = 1e-12 * std::max(1.0, now_);
            std::vector<int>& ended = ended_;
            ended.clear();
            for (size_t i = 0; i < flows_.size();) {
                if (flows_[i].left <= flows_[i].rate * eps || flows_[i].left <= 0) {
                    ended.push_back(flows_[i].job);
                    live_path_ -= size_t(flows_[i].path_len);
                    flows_[i] = flows_.back();
                    flows_.pop_back();
                    dirty_ = true;
                } else {
                    ++i;
                }
            }
            for (int j : ended) {
                if (--open_[size_t(j)] == 0) begin_step(j);
            }
            while (!waiting_.empty() && waiting_.top().first <= now_ + eps) {
                const int j = waiting_.top().second;
                waiting_.pop();
                start_transfers(j);
            }
        }
        finish_stats();
        return stats_;
    }

  private:
    static constexpr double kInf = std::numeric_limits<double>::infinity();

    // The job's next step: after its latency, its transfers start.
    void begin_step(int j) {
        const auto& steps = jobs_[size_t(j)];
        size_t& s = next_step_[size_t(j)];
        // A step that has run all its times gives way to the next.
        while (s < steps.size() && (done_times_[size_t(j)] >= steps[s].times ||
                                    (steps[s].transfers.empty() && steps[s].latency == 0))) {
            ++s;
            done_times_[size_t(j)] = 0;
        }
        if (s >= steps.size()) {
            stats_.finish_s[size_t(j)] = now_;
            return;
        }
        waiting_.emplace(now_ + steps[s].latency, j);
    }

    void start_transfers(int j) {
        const Step& st = jobs_[size_t(j)][next_step_[size_t(j)]];
        ++done_times_[size_t(j)];
        for (const Transfer& t : st.transfers) {
            if (t.bytes <= 0 || t.src == t.dst) continue;
            Flow fl{j, int(paths_.size()), 0, t.bytes};
            f_.route(t.src, t.dst, paths_);
            fl.path_len = int(paths_.size()) - fl.path_begin;
            live_path_ += size_t(fl.path_len);
            flows_.push_back(fl);
            ++open_[size_t(j)];
            ++stats_.flows;
            dirty_ = true;
        }
        if (open_[size_t(j)] == 0) begin_step(j);  // nothing to send: the step is its latency
        // Paths of ended flows are garbage: drop them once they dominate.
        if (paths_.size() > 4 * live_path_ + (size_t(1) << 20)) compact_paths();
    }

    // Max-min fair rates by progressive filling: the links with the
    // smallest fair share fix the rates of their flows, which then leave
    // the other links' shares; repeat until every flow has a rate.
    void rates() {
        ++stats_.events;
        used_.clear();
        for (const Flow& fl : flows_) {
            for (int k = 0; k < fl.path_len; ++k) {
                const int l = paths_[size_t(fl.path_begin + k)];
                if (users_[size_t(l)]++ == 0) {
                    used_.push_back(l);
                    cap_left_[size_t(l)] = f_.capacity(size_t(l));
                }
            }
        }
        std::vector<char>& fixed = fixed_;
        fixed.assign(flows_.size(), 0);
        size_t left = flows_.size();
        while (left > 0) {
            double share = kInf;
            for (int l : used_) {
                if (users_[size_t(l)] > 0) {
                    share = std::min(share, cap_left_[size_t(l)] / users_[size_t(l)]);
                }
            }
            APIARY_CHECK(std::isfinite(share) && share > 0, "no bottleneck for {} flows", left);
            const double tol = share * (1 + 1e-12);
            for (size_t i = 0; i < flows_.size(); ++i) {
                if (fixed[i]) continue;
                const Flow& fl = flows_[i];
                bool bottlenecked = false;
                for (int k = 0; k < fl.path_len && !bottlenecked; ++k) {
                    const int l = paths_[size_t(fl.path_begin + k)];
                    bottlenecked = cap_left_[size_t(l)] / users_[size_t(l)] <= tol;
                }
                if (!bottlenecked) continue;
                fixed[i] = 1;
                --left;
                flows_[i].rate = share;
                for (int k = 0; k < fl.path_len; ++k) {
                    const int l = paths_[size_t(fl.path_begin + k)];
                    cap_left_[size_t(l)] -= share;
                    --users_[size_t(l)];
                }
            }
        }
        for (int l : used_) {
            users_[size_t(l)] = 0;
            const double load = 1 - cap_left_[size_t(l)] / f_.capacity(size_t(l));
            peak_[size_t(l)] = std::max(peak_[size_t(l)], load);
        }
        dirty_ = false;
    }

    void advance(double t) {
        const double dt = t - now_;
        if (dt > 0) {
            for (Flow& fl : flows_) {
                fl.left -= fl.rate * dt;
                for (int k = 0; k < fl.path_len; ++k) {
                    bytes_[size_t(paths_[size_t(fl.path_begin + k)])] += fl.rate * dt;
                }
            }
        }
        now_ = t;
    }

    void compact_paths() {
        std::vector<int>& p = spare_paths_;  // reused: no allocation once grown
        p.clear();
        for (Flow& fl : flows_) {
            const int b = int(p.size());
            p.insert(p.end(), paths_.begin() + fl.path_begin,
                     paths_.begin() + fl.path_begin + fl.path_len);
            fl.path_begin = b;
        }
        paths_.swap(p);
    }

    void finish_stats() {
        if (now_ <= 0) return;
        for (size_t l = 0; l < f_.links(); ++l) {
            const double u = bytes_[l] / (f_.capacity(l) * now_);
            if (u > stats_.hottest_link_util) {
                stats_.hottest_link_util = u;
                stats_.hottest_link = f_.link_name(l);
            }
            if (!f_.device_link(l) && peak_[l] > stats_.hottest_switch_peak) {
                stats_.hottest_switch_peak = peak_[l];
                stats_.hottest_switch = f_.link_name(l);
            }
        }
    }

    const Fabric& f_;
    const std::vector<std::vector<Step>>& jobs_;
    FlowStats stats_;
    double now_ = 0;
    bool dirty_ = true;
    std::vector<Flow> flows_;
    std::vector<int> paths_;
    std::vector<size_t> next_step_;
    std::vector<long long> done_times_;  // runs of the current step started
    std::vector<int> open_;
    std::priority_queue<std::pair<double, int>, std::vector<std::pair<double, int>>, std::greater<>>
        waiting_;
    std::vector<double> cap_left_;
    std::vector<int> users_;
    std::vector<int> used_;
    std::vector<double> bytes_;
    std::vector<double> peak_;
    size_t live_path_ = 0;  // path entries of flows still running
    std::vector<int> spare_paths_, ended_;
    std::vector<char> fixed_;
};

}  // namespace

FlowStats simulate_flows(const Fabric& fabric, const std::vector<std::vector<Step>>& jobs) {
    Sim s(fabric, jobs);
    return s.run();
}

}  // namespace apiary::sim
