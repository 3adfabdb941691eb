#pragma once
// OpenMP queries that also compile (as a single thread) without OpenMP.
#ifdef _OPENMP
#include <omp.h>
inline int omp_get_num_threads_safe() { return omp_get_num_threads(); }
inline int omp_get_thread_num_safe() { return omp_get_thread_num(); }
inline int omp_get_max_threads_safe() { return omp_get_max_threads(); }
#else
inline int omp_get_num_threads_safe() { return 1; }
inline int omp_get_thread_num_safe() { return 0; }
inline int omp_get_max_threads_safe() { return 1; }
#endif
