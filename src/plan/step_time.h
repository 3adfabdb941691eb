#pragma once
// Time of one optimizer step: GEMMs at a size-dependent fraction of peak,
// memory-bound elementwise work, TP / PP / DP / ZeRO communication, the
// pipeline bubble and the optimizer update. Formulas and sources in
// docs/planner.md.

#include "plan/types.h"

namespace apiary::plan {

// Fraction of peak a GEMM of (m x k) @ (k x n) reaches on this device.
double gemm_efficiency(const Device& d, double m, double n, double k);

// Megatron-LM model FLOPs of one optimizer step (Narayanan et al. 2021,
// Appendix; core::ModelSpec::train_flops_per_token), and the extra FLOPs that
// recomputation adds.
double model_flops_per_step(const Workload& w);
double recompute_flops_per_step(const Workload& w, Recompute r);

// Pipeline bubble as a fraction of ideal time: (p - 1) / (v m).
double bubble_fraction(int pp, long long n_micro, int vpp);

StepTime step_time(const Workload& w, const Layout& l, const Cluster& c);

}  // namespace apiary::plan
