#include "plan/totals.h"

#include <algorithm>
#include <cmath>

namespace apiary::plan {

double young_interval_s(double ckpt_s, double mtbf_s) { return std::sqrt(2 * ckpt_s * mtbf_s); }

double daly_interval_s(double ckpt_s, double mtbf_s) {
    if (ckpt_s >= 2 * mtbf_s) return mtbf_s;
    const double r = ckpt_s / (2 * mtbf_s);
    return std::sqrt(2 * ckpt_s * mtbf_s) * (1 + std::sqrt(r) / 3 + r / 9) - ckpt_s;
}

double goodput(double interval_s, double ckpt_s, double mtbf_s, double restart_s) {
    const double lost = (restart_s + (interval_s + ckpt_s) / 2) / mtbf_s;
    if (lost >= 1) return 0;
    return (1 - lost) / (1 + ckpt_s / interval_s);
}

double profile_gco2(const std::vector<double>& profile, double start_hour, double hours,
                    double kw) {
    const double n = double(profile.size());
    double g = 0, h = start_hour, left = hours;
    // Whole profile cycles first, so long runs cost O(profile) not O(hours).
    double sum = 0;
    for (double v : profile) sum += v;
    const double cycles = std::floor(left / n);
    g += cycles * sum * kw;
    left -= cycles * n;
    while (left > 0) {
        const double in_hour = std::min(left, std::floor(h) + 1 - h);
        g += profile[size_t(std::fmod(std::floor(h), n))] * kw * in_hour;
        h += in_hour;
        left -= in_hour;
    }
    return g;
}

namespace {

double wall_for(double ideal_s, double ckpt_s, double mtbf_s, double restart_s, double* interval,
                double* gp) {
    *interval = daly_interval_s(ckpt_s, mtbf_s);
    *gp = goodput(*interval, ckpt_s, mtbf_s, restart_s);
    return *gp > 0 ? ideal_s / *gp : INFINITY;
}

}  // namespace

Totals run_totals(const Workload& w, const Layout& l, const Cluster& c, const StepTime& st,
                  const Memory& mem) {
    Totals t;
    const double tokens_per_step = double(w.global_batch) * w.seq_len;
    t.steps = w.tokens / tokens_per_step;
    t.ideal_s = t.steps * st.total;
    const double nodes = double(c.nodes());
    const double devs = double(l.devices());
    // A checkpoint writes each device's weights and optimizer shard in parallel.
    const double ckpt_s =
        c.ckpt_write_s > 0 ? c.ckpt_write_s : (mem.params + mem.optimizer) / c.ckpt_bw;
    const double restart = c.restart_s;
    const double fail_per_h = nodes / c.mtbf_node_hours;
    double gp = 1, interval = 0;
    const double wall_od = wall_for(t.ideal_s, ckpt_s, 3600 / fail_per_h, restart, &interval, &gp);
    double gp_spot = 1, interval_spot = 0;
    const double spot_per_h = fail_per_h + nodes * c.spot_preempt_per_node_hour;
    t.spot_wall_s =
        wall_for(t.ideal_s, ckpt_s, 3600 / spot_per_h, restart, &interval_spot, &gp_spot);
    t.wall_s = c.spot ? t.spot_wall_s : wall_od;
    t.goodput = c.spot ? gp_spot : gp;
    t.ckpt_interval_s = c.spot ? interval_spot : interval;
    t.gpu_hours = t.wall_s * devs / 3600;
    t.cost_on_demand_usd = wall_od * devs / 3600 * c.price_hour;
    t.cost_spot_usd = t.spot_wall_s * devs / 3600 * c.spot_price_hour;
    t.cost_usd = c.spot ? t.cost_spot_usd : t.cost_on_demand_usd;

    // Power: devices between idle and TDP by the busy (compute) fraction of
    // a step, hosts and network, all times PUE. Ranks sharing a CPU count once.
    const double busy = st.total > 0 ? (st.compute + st.recompute) / st.total : 0;
    const double power_devices = c.dev.shared_by_ranks ? nodes : devs;
    const double dev_w = c.dev.tdp_w * (c.idle_frac + (1 - c.idle_frac) * busy);
    const double watts =
        power_devices * dev_w + nodes * c.dev.host_w_per_node + devs * c.network_w_per_device;
    t.power_kw = watts * c.pue / 1000;
    const double hours = t.wall_s / 3600;
    t.energy_kwh = t.power_kw * hours;
    if (c.gco2_profile.empty()) {
        t.co2e_t = t.energy_kwh * c.gco2_per_kwh / 1e6;
        t.best_co2e_t = t.co2e_t;
        t.best_start_hour = c.start_hour;
    } else {
        t.co2e_t = profile_gco2(c.gco2_profile, c.start_hour, hours, t.power_kw) / 1e6;
        t.best_co2e_t = t.co2e_t;
        t.best_start_hour = c.start_hour;
        for (size_t h = 0; h < c.gco2_profile.size(); ++h) {
            const double g = profile_gco2(c.gco2_profile, double(h), hours, t.power_kw) / 1e6;
            if (g < t.best_co2e_t - 1e-12) t.best_co2e_t = g, t.best_start_hour = double(h);
        }
    }
    return t;
}

}  // namespace apiary::plan
