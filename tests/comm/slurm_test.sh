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

work=$(mktemp -d /tmp/apiary-slurm.XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

# munge: its own key, socket and files, so a system munged is not disturbed.
mkdir -p "$work/munge"
dd if=/dev/urandom of="$work/munge/munge.key" bs=1024 count=1 status=none
chmod 700 "$work/munge"
chmod 400 "$work/munge/munge.key"
munged --force --foreground --key-file="$work/munge/munge.key" \
    --socket="$work/munge/munge.socket" --pid-file="$work/munge/munged.pid" \
    --log-file="$work/munge/munged.log" --seed-file="$work/munge/munged.seed" \
    >"$work/munged.out" 2>&1 &
pids+=($!)

host=$(hostname -s)
mkdir -p "$work/state" "$work/spool"
cat > "$work/slurm.conf" <<CONF
ClusterName=apiarytest
SlurmctldHost=$host
SlurmctldPort=16817
SlurmdPort=16818
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$work/munge/munge.socket
CredType=cred/munge
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/slurmctld.log
SlurmdLogFile=$work/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=pmix
ReturnToService=2
SchedulerType=sched/builtin
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
NodeName=$host CPUs=$(nproc) State=UNKNOWN
PartitionName=test Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
export SLURM_CONF="$work/slurm.conf"
for i in $(seq 50); do [ -S "$work/munge/munge.socket" ] && break; sleep 0.1; done
slurmctld -D -i -f "$SLURM_CONF" >"$work/slurmctld.out" 2>&1 &
pids+=($!)
slurmd -D -f "$SLURM_CONF" >"$work/slurmd.out" 2>&1 &
pids+=($!)
for i in $(seq 100); do
    sinfo -h -o %t 2>/dev/null | grep -q idle && break
    sleep 0.3
done
if ! sinfo -h -o %t 2>/dev/null | grep -q idle; then
    echo "slurm_test: the node never became idle"
    tail -n 20 "$work/slurmctld.log" "$work/slurmd.log" 2>/dev/null || true
    exit 1
fi

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
