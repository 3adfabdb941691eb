#pragma once
// Thread control: one place that sets how many threads kernels (OpenMP) and
// oneDNN use, so a rank never oversubscribes the cores it was given.

namespace apiary::core {

// n <= 0: OMP_NUM_THREADS if set, else this process's cores divided by the
// ranks that share the machine.
void set_num_threads(int n);
int num_threads();
// Cores in this process's affinity mask.
int available_cores();

}  // namespace apiary::core
