#!/usr/bin/env bash
# Starts a throw-away one-node Slurm cluster (munge, slurmctld, slurmd, all in
# a temporary directory, on non-default ports), runs the 2-rank MPI test suite
# with `srun` and with `sbatch --wait`, and stops it again.
#   slurm_test.sh <test_comm_mpi binary> <apiary binary>
# Exit 0: both jobs formed one 2-rank world and passed; 77: skipped (not
# root). Needs slurm-wlm and munge (scripts/install-deps.sh) and root (slurmd
# runs job steps as their user). Uses ports 16817-16818.
set -euo pipefail
mpi_test=$1
apiary=$2
if [ "$(id -u)" -ne 0 ]; then
    echo "slurm_test: skipped: needs root (slurmd runs the job steps)"
    exit 77
fi
for prog in munged slurmctld slurmd srun sbatch sinfo; do
    command -v "$prog" >/dev/null || { echo "slurm_test: $prog missing (run scripts/install-deps.sh)"; exit 1; }
done

source "$(dirname "$0")/../slurm_cluster.sh"
slurm_cluster_start "$work"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export APIARY_EXPECT_WORLD_SIZE=2

echo "== srun -n 2"
timeout 120 srun -n 2 --oversubscribe "$mpi_test" --gtest_brief=1

echo "== sbatch --wait"
cat > "$work/job.sh" <<JOB
#!/bin/bash
#SBATCH -n 2 --oversubscribe --output=$work/job.out
srun "$mpi_test" --gtest_brief=1
# apiary launch picks srun inside the allocation
"$apiary" launch -n 2 -- config show --set comm.timeout_s=9 | grep -c "timeout_s = 9"
JOB
timeout 180 sbatch --wait "$work/job.sh"
cat "$work/job.out"
grep -q "PASSED" "$work/job.out"
[ "$(tail -n 1 "$work/job.out")" = "2" ]
echo "slurm_test: srun and sbatch --wait ran 2-rank jobs"
