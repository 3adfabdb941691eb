#include "core/threads.h"

#include <omp.h>
#include <sched.h>

namespace apiary::core {

int available_cores() {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
    return omp_get_num_procs();
}

void set_num_threads(int n) {
    if (n <= 0) n = available_cores();
    omp_set_num_threads(n);
}

int num_threads() { return omp_get_max_threads(); }

}  // namespace apiary::core
