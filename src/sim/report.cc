#include "sim/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <ostream>

#include "sim/text.h"

namespace apiary::sim {

double percentile(std::vector<double> v, double q) {
    if (v.empty()) return 0;
    const size_t k = size_t(std::ceil(q * double(v.size())));
    const size_t i = std::min(v.size() - 1, k == 0 ? 0 : k - 1);
    std::nth_element(v.begin(), v.begin() + long(i), v.end());
    return v[i];
}

Summary summarize(const std::vector<SimJob>& jobs, const SimResult& r) {
    Summary s;
    s.policy = r.policy;
    s.jobs = (long long)jobs.size();
    std::vector<double> waits, completions;
    for (size_t j = 0; j < jobs.size(); ++j) {
        const JobOutcome& o = r.jobs[j];
        s.completed += o.state == JobState::completed;
        s.timeouts += o.state == JobState::timeout;
        s.rejected += o.state == JobState::rejected;
        s.unfinished += o.state == JobState::unfinished;
        if (o.start >= 0) waits.push_back(o.start - jobs[j].spec.submit);
        if (o.end >= 0) completions.push_back(o.end - jobs[j].spec.submit);
        s.device_hours += o.device_s / 3600;
        s.lost_device_hours += o.lost_device_s / 3600;
        s.overhead_device_hours += o.overhead_device_s / 3600;
        s.restarts += o.restarts;
        s.preemptions += o.preemptions;
        s.failure_restarts += o.failures;
        s.cost_usd += o.cost_usd;
        s.energy_kwh += o.energy_kwh;
        s.co2_kg += o.co2_g / 1000;
    }
    auto mean = [](const std::vector<double>& v) {
        return v.empty() ? 0.0 : std::accumulate(v.begin(), v.end(), 0.0) / double(v.size());
    };
    s.mean_wait_s = mean(waits);
    s.p50_wait_s = percentile(waits, 0.5);
    s.p95_wait_s = percentile(waits, 0.95);
    s.max_wait_s = waits.empty() ? 0 : *std::max_element(waits.begin(), waits.end());
    s.mean_completion_s = mean(completions);
    s.p95_completion_s = percentile(completions, 0.95);
    s.makespan_s = r.makespan;
    s.utilisation = r.available_device_s > 0 ? r.busy_device_s / r.available_device_s : 0;
    s.idle_energy_kwh = r.idle_energy_kwh;
    s.fragmented_device_hours = r.fragmented_device_s / 3600;
    s.leaf_fit_runs = r.leaf_fit_runs;
    s.leaf_split_runs = r.leaf_split_runs;
    const double idle_s = r.available_device_s - r.busy_device_s;
    s.fragmented_idle_share = idle_s > 0 ? r.fragmented_device_s / idle_s : 0;
    s.co2_kg += r.idle_co2_g / 1000;
    s.node_failures = r.node_failures;
    s.spot_reclaims = r.spot_reclaims;
    s.events = r.events;
    s.wall_s = r.wall_s;
    return s;
}

nlohmann::json to_json(const Summary& s) {
    return {{"policy", s.policy},
            {"jobs", s.jobs},
            {"completed", s.completed},
            {"timeouts", s.timeouts},
            {"rejected", s.rejected},
            {"unfinished", s.unfinished},
            {"mean_wait_s", s.mean_wait_s},
            {"p50_wait_s", s.p50_wait_s},
            {"p95_wait_s", s.p95_wait_s},
            {"max_wait_s", s.max_wait_s},
            {"mean_completion_s", s.mean_completion_s},
            {"p95_completion_s", s.p95_completion_s},
            {"makespan_s", s.makespan_s},
            {"utilisation", s.utilisation},
            {"device_hours", s.device_hours},
            {"lost_device_hours", s.lost_device_hours},
            {"overhead_device_hours", s.overhead_device_hours},
            {"restarts", s.restarts},
            {"preemptions", s.preemptions},
            {"failure_restarts", s.failure_restarts},
            {"node_failures", s.node_failures},
            {"spot_reclaims", s.spot_reclaims},
            {"cost_usd", s.cost_usd},
            {"energy_kwh", s.energy_kwh},
            {"idle_energy_kwh", s.idle_energy_kwh},
            {"fragmented_device_hours", s.fragmented_device_hours},
            {"fragmented_idle_share", s.fragmented_idle_share},
            {"leaf_fit_runs", s.leaf_fit_runs},
            {"leaf_split_runs", s.leaf_split_runs},
            {"co2_kg", s.co2_kg},
            {"events", s.events},
            {"wall_s", s.wall_s},
            {"events_per_s", s.wall_s > 0 ? double(s.events) / s.wall_s : 0}};
}

std::string format_duration(double s) {
    if (s < 120) return fmt::format("{:.0f}s", s);
    if (s < 7200) return fmt::format("{:.1f}m", s / 60);
    if (s < 172800) return fmt::format("{:.1f}h", s / 3600);
    return fmt::format("{:.1f}d", s / 86400);
}

std::string summary_table(const std::vector<Summary>& rows) {
    std::string out = fmt::format(
        "{:<24} {:>7} {:>7} {:>5} {:>8} {:>8} {:>8} {:>6} {:>11} {:>10} {:>8} {:>12} {:>10} "
        "{:>10}\n",
        "policy", "jobs", "done", "rej", "wait", "p95", "complete", "util", "device-h", "lost-h",
        "restarts", "cost $", "energy kWh", "CO2 kg");
    for (const auto& s : rows) {
        out += fmt::format(
            "{:<24} {:>7} {:>7} {:>5} {:>8} {:>8} {:>8} {:>5.1f}% {:>11.4g} {:>10.4g} {:>8} "
            "{:>12.4g} {:>10.4g} {:>10.4g}\n",
            s.policy, s.jobs, s.completed + s.timeouts, s.rejected, format_duration(s.mean_wait_s),
            format_duration(s.p95_wait_s), format_duration(s.mean_completion_s),
            100 * s.utilisation, s.device_hours, s.lost_device_hours, s.restarts, s.cost_usd,
            s.energy_kwh + s.idle_energy_kwh, s.co2_kg);
    }
    return out;
}

void write_jobs_csv(const std::vector<SimJob>& jobs, const std::vector<SimResult>& results,
                    std::ostream& out) {
    out << "id,policy,state,submit,eligible,start,end,wait_s,run_s,completion_s,restarts,"
           "preemptions,failures,device_hours,lost_device_hours,cost_usd,energy_kwh,co2_kg,"
           "recorded_start,recorded_end,recorded_wait_s,reason\n";
    for (const auto& r : results) {
        for (size_t j = 0; j < jobs.size(); ++j) {
            const auto& o = r.jobs[j];
            const auto& s = jobs[j].spec;
            const bool ran = o.start >= 0;
            auto opt = [](double v) { return v >= 0 ? fmt::format("{}", v) : std::string(); };
            out << fmt::format(
                "{},{},{},{},{},{},{},{},{},{},{},{},{},{:.6g},{:.6g},{:.6g},{:.6g},{:.6g},{},{},{}"
                ","
                "{}\n",
                csv_quote(s.id), csv_quote(r.policy), job_state_name(o.state), s.submit, o.eligible,
                ran ? fmt::format("{}", o.start) : "", o.end >= 0 ? fmt::format("{}", o.end) : "",
                ran ? fmt::format("{}", o.start - s.submit) : "",
                ran && o.end >= 0 ? fmt::format("{}", o.end - o.start) : "",
                o.end >= 0 ? fmt::format("{}", o.end - s.submit) : "", o.restarts, o.preemptions,
                o.failures, o.device_s / 3600, o.lost_device_s / 3600, o.cost_usd, o.energy_kwh,
                o.co2_g / 1000, opt(s.recorded_start), opt(s.recorded_end),
                s.recorded_start >= 0 ? fmt::format("{}", s.recorded_start - s.submit) : "",
                csv_quote(jobs[j].reject, true));
        }
    }
}

void write_series_csv(const std::vector<SimResult>& results, std::ostream& out) {
    out << "policy,t,busy_devices,available_devices,queued_jobs\n";
    for (const auto& r : results) {
        for (const auto& p : r.series) {
            out << fmt::format("{},{},{},{},{}\n", r.policy, p.t, p.busy, p.available, p.queued);
        }
    }
}

nlohmann::json jobs_json(const std::vector<SimJob>& jobs, const SimResult& r) {
    nlohmann::json a = nlohmann::json::array();
    for (size_t j = 0; j < jobs.size(); ++j) {
        const auto& o = r.jobs[j];
        nlohmann::json x = {{"id", jobs[j].spec.id},
                            {"state", job_state_name(o.state)},
                            {"submit", jobs[j].spec.submit},
                            {"eligible", o.eligible},
                            {"restarts", o.restarts},
                            {"preemptions", o.preemptions},
                            {"failures", o.failures},
                            {"device_hours", o.device_s / 3600},
                            {"lost_device_hours", o.lost_device_s / 3600},
                            {"cost_usd", o.cost_usd},
                            {"energy_kwh", o.energy_kwh},
                            {"co2_kg", o.co2_g / 1000}};
        if (o.start >= 0) x["start"] = o.start, x["wait_s"] = o.start - jobs[j].spec.submit;
        if (o.end >= 0) x["end"] = o.end, x["completion_s"] = o.end - jobs[j].spec.submit;
        if (!jobs[j].reject.empty()) x["reason"] = jobs[j].reject;
        if (jobs[j].spec.recorded_start >= 0) {
            x["recorded_start"] = jobs[j].spec.recorded_start;
            x["recorded_wait_s"] = jobs[j].spec.recorded_start - jobs[j].spec.submit;
        }
        a.push_back(std::move(x));
    }
    return a;
}

namespace {

// Job indices ordered by a time, ties by index (both Slurm and the
// simulator break ties in submit order).
std::vector<size_t> order_by(const std::vector<size_t>& idx, const std::vector<double>& t) {
    std::vector<size_t> o = idx;
    std::stable_sort(o.begin(), o.end(), [&](size_t a, size_t b) { return t[a] < t[b]; });
    return o;
}

}  // namespace

namespace {

std::vector<double> ranks(const std::vector<double>& v) {
    std::vector<size_t> idx(v.size());
    for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
    std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return v[a] < v[b]; });
    std::vector<double> r(v.size());
    for (size_t i = 0; i < idx.size();) {
        size_t k = i;
        while (k + 1 < idx.size() && v[idx[k + 1]] == v[idx[i]]) ++k;
        const double mean_rank = 0.5 * double(i + k) + 1;  // ties share their mean rank
        for (size_t m = i; m <= k; ++m) r[idx[m]] = mean_rank;
        i = k + 1;
    }
    return r;
}

}  // namespace

double spearman(const std::vector<double>& a, const std::vector<double>& b) {
    if (a.size() != b.size() || a.size() < 2) return 0;
    const auto ra = ranks(a), rb = ranks(b);
    const double n = double(a.size());
    double ma = 0, mb = 0;
    for (size_t i = 0; i < ra.size(); ++i) ma += ra[i] / n, mb += rb[i] / n;
    double sab = 0, saa = 0, sbb = 0;
    for (size_t i = 0; i < ra.size(); ++i) {
        sab += (ra[i] - ma) * (rb[i] - mb);
        saa += (ra[i] - ma) * (ra[i] - ma);
        sbb += (rb[i] - mb) * (rb[i] - mb);
    }
    return saa > 0 && sbb > 0 ? sab / std::sqrt(saa * sbb) : 0;
}

ReplayCheck check_replay(const std::vector<SimJob>& jobs, const SimResult& r, double from) {
    ReplayCheck c;
    c.from = from;
    std::vector<double> sim_w, rec_w;
    for (size_t j = 0; j < jobs.size(); ++j) {
        const auto& s = jobs[j].spec;
        const auto& o = r.jobs[j];
        if (s.recorded_start < 0 || o.start < 0 || s.submit < from) continue;
        sim_w.push_back(o.start - s.submit);
        rec_w.push_back(s.recorded_start - s.submit);
    }
    c.waits_compared = (long long)sim_w.size();
    if (!sim_w.empty()) {
        for (size_t i = 0; i < sim_w.size(); ++i) {
            c.mean_wait_s += sim_w[i] / double(sim_w.size());
            c.recorded_mean_wait_s += rec_w[i] / double(rec_w.size());
        }
        c.p90_wait_s = percentile(sim_w, 0.9);
        c.recorded_p90_wait_s = percentile(rec_w, 0.9);
        c.spearman_wait = spearman(sim_w, rec_w);
    }
    std::vector<size_t> idx;
    std::vector<double> rs(jobs.size()), re(jobs.size()), ss(jobs.size()), se(jobs.size());
    double sum = 0;
    for (size_t j = 0; j < jobs.size(); ++j) {
        const auto& s = jobs[j].spec;
        const auto& o = r.jobs[j];
        if (s.recorded_start < 0 || o.start < 0 || o.end < 0) continue;
        idx.push_back(j);
        rs[j] = s.recorded_start, re[j] = s.recorded_end, ss[j] = o.start, se[j] = o.end;
        c.max_start_err_s = std::max(c.max_start_err_s, std::abs(o.start - s.recorded_start));
        c.max_end_err_s = std::max(c.max_end_err_s, std::abs(o.end - s.recorded_end));
        sum += std::abs(o.start - s.recorded_start);
    }
    c.compared = (long long)idx.size();
    if (c.compared > 0) c.mean_abs_start_err_s = sum / double(c.compared);
    auto compare = [&](const std::vector<double>& rec, const std::vector<double>& sim,
                       const char* what, bool* same) {
        const auto a = order_by(idx, rec), b = order_by(idx, sim);
        for (size_t i = 0; i < a.size(); ++i) {
            if (a[i] == b[i]) continue;
            *same = false;
            if (c.first_difference.empty()) {
                c.first_difference =
                    fmt::format("{} #{}: the record has job {}, the simulator job {}", what, i + 1,
                                jobs[a[i]].spec.id, jobs[b[i]].spec.id);
            }
            return;
        }
    };
    compare(rs, ss, "start", &c.same_start_order);
    compare(re, se, "end", &c.same_end_order);
    return c;
}

nlohmann::json to_json(const ReplayCheck& c) {
    nlohmann::json j = {{"compared", c.compared},
                        {"max_start_err_s", c.max_start_err_s},
                        {"max_end_err_s", c.max_end_err_s},
                        {"mean_abs_start_err_s", c.mean_abs_start_err_s},
                        {"same_start_order", c.same_start_order},
                        {"same_end_order", c.same_end_order},
                        {"from_s", c.from},
                        {"waits_compared", c.waits_compared},
                        {"mean_wait_s", c.mean_wait_s},
                        {"recorded_mean_wait_s", c.recorded_mean_wait_s},
                        {"p90_wait_s", c.p90_wait_s},
                        {"recorded_p90_wait_s", c.recorded_p90_wait_s},
                        {"spearman_wait", c.spearman_wait}};
    if (!c.first_difference.empty()) j["first_difference"] = c.first_difference;
    return j;
}

}  // namespace apiary::sim
