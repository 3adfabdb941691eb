#pragma once
// Thread control: one place that sets how many threads kernels (OpenMP) and
// oneDNN use, so a rank never oversubscribes the cores it was given.

namespace apiary::core {

// n <= 0 means every core this process may run on.
void set_num_threads(int n);
int num_threads();
// Cores in this process's affinity mask.
int available_cores();

}  // namespace apiary::core
