#pragma once
// Run totals: time-to-train, goodput under failures and preemptions with the
// Young/Daly checkpoint interval, GPU-hours, cost, energy and emissions.

#include "plan/types.h"

namespace apiary::plan {

// Young (1974): sqrt(2 delta M). Daly (2006) higher-order optimum for
// delta < 2M, M otherwise.
double young_interval_s(double ckpt_s, double mtbf_s);
double daly_interval_s(double ckpt_s, double mtbf_s);
// Useful fraction of wall time with checkpoints of ckpt_s every interval_s,
// failures every mtbf_s on average and restart_s lost per failure (Daly 2006,
// first order): 1 / ((1 + delta/tau) / (1 - (R + (tau + delta)/2) / M)).
double goodput(double interval_s, double ckpt_s, double mtbf_s, double restart_s);

// Grams of CO2e for `kw` drawn for `hours` starting at `start_hour` of an
// hourly intensity profile (gCO2e/kWh) that repeats.
double profile_gco2(const std::vector<double>& profile, double start_hour, double hours, double kw);

Totals run_totals(const Workload& w, const Layout& l, const Cluster& c, const StepTime& st,
                  const Memory& mem);

}  // namespace apiary::plan
