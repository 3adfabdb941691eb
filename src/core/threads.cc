#include "core/threads.h"

#include <omp.h>
#include <sched.h>

#include <algorithm>
#include <cstdlib>

namespace apiary::core {

int available_cores() {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
    return omp_get_num_procs();
}

namespace {
int env_int(const char* name) {
    const char* v = std::getenv(name);
    return v ? std::atoi(v) : 0;
}
}  // namespace

void set_num_threads(int n) {
    if (n <= 0) n = env_int("OMP_NUM_THREADS");
    if (n <= 0) {
        // Ranks sharing a machine share its cores (OpenMPI and Slurm say how
        // many ranks run here).
        int local = env_int("OMPI_COMM_WORLD_LOCAL_SIZE");
        if (local <= 0) local = env_int("SLURM_NTASKS_PER_NODE");
        n = std::max(1, available_cores() / std::max(1, local));
    }
    omp_set_num_threads(n);
}

int num_threads() { return omp_get_max_threads(); }

}  // namespace apiary::core
