#!/usr/bin/env bash
# Slurm over two hosts of the test cluster (cluster.sh): slurmctld on h1, a
# slurmd on h1 and on h2 (NodeName = the host's name, NodeAddr = its
# address), munge on a socket of the test's own. A 2-node job of
# deploy/slurm/train.sbatch (--requeue, --signal=B:USR1@60) trains dp 4
# with srun; mid-run h2 is set DOWN (`scontrol update NodeName=h2
# State=DOWN`): Slurm ends the job and puts it back in the queue; once h2
# is back (State=RESUME) the job runs again, continues from its newest
# complete checkpoint (--auto-resume) and reaches its last step, every
# step logged once.
#   slurm_node_down_test.sh <apiary binary>
set -eu
apiary=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
if [ "$(id -u)" -ne 0 ]; then
    echo "slurm_node_down_test: skipped: needs root (namespaces; slurmd runs the job steps)"
    exit 77
fi
for t in slurmctld slurmd munged sbatch scontrol squeue; do
    command -v "$t" >/dev/null || {
        echo "slurm_node_down_test: skipped: no $t (scripts/install-deps.sh: slurm-wlm, munge)"
        exit 77
    }
done
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
cluster="$here/cluster.sh"
source "$here/../slurm_lib.sh"
APIARY_CLUSTER_ID="s$(printf '%x' $(($$ & 0xfffff)))"
tmp=$(mktemp -d /tmp/apiary-cluster-slurm.XXXXXX)
APIARY_CLUSTER_DIR=$tmp/cluster
export APIARY_CLUSTER_ID APIARY_CLUSTER_DIR
work=$tmp/slurm
munge_pid=
cleanup() {
    # Every process in the hosts (slurmctld, the slurmds, their steps) ends
    # with the cluster; munged runs outside it.
    bash "$cluster" down >/dev/null 2>&1 || true
    [ -n "$munge_pid" ] && kill "$munge_pid" 2>/dev/null || true
    if [ -n "${KEEP:-}" ]; then echo "kept $tmp"; else rm -rf "$tmp"; fi
}
trap cleanup EXIT
trap 'exit 1' INT TERM
fail() {
    echo "slurm_node_down_test: FAILED: $*" >&2
    for f in "$work/job.out" "$work/slurmctld.log"; do
        [ -f "$f" ] && { echo "--- $f (end)"; tail -n 40 "$f"; }
    done
    exit 1
}
on_h1() { bash "$cluster" exec h1 "$@"; }

bash "$cluster" up 2 >/dev/null
mkdir -p "$work/state"
slurm_munged "$work"

# One slurm.conf for every daemon; what differs per node is named by %n.
cat >"$work/slurm.conf" <<CONF
ClusterName=apiarynet
SlurmctldHost=h1(10.213.0.1)
$(slurm_conf_auth "$work/munge/munge.socket")
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool-%n
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd-%n.pid
SlurmctldLogFile=$work/slurmctld.log
SlurmdLogFile=$work/slurmd-%n.log
$(slurm_conf_plugins)
ReturnToService=1
SchedulerType=sched/builtin
SchedulerParameters=sched_min_interval=0
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
NodeName=h1 NodeAddr=10.213.0.1 CPUs=2 State=UNKNOWN
NodeName=h2 NodeAddr=10.213.0.2 CPUs=2 State=UNKNOWN
PartitionName=test Nodes=h1,h2 Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
export SLURM_CONF="$work/slurm.conf"
bash "$cluster" exec h1 slurmctld -D -i -f "$SLURM_CONF" >"$work/slurmctld.out" 2>&1 &
# The hosts share one file system: each slurmd gets a copy of the config
# with a TmpFS of its own, where the PMIx plugin makes its per-step
# directory (/tmp/spmix_appdir_<uid>_<job>.<step> on both nodes otherwise,
# and the second node's step fails to start). slurmctld logs that their
# configs differ; nothing else depends on it.
for h in h1 h2; do
    mkdir -p "$work/tmp-$h"
    sed "s|^ClusterName=|TmpFS=$work/tmp-$h\nClusterName=|" "$SLURM_CONF" >"$work/slurm-$h.conf"
    bash "$cluster" exec "$h" slurmd -D -f "$work/slurm-$h.conf" -N "$h" >"$work/slurmd-$h.out" 2>&1 &
done
for _ in $(seq 150); do
    [ "$(on_h1 sinfo -h -N -o '%N %t' 2>/dev/null | grep -c ' idle')" = 2 ] && break
    sleep 0.3
done
[ "$(on_h1 sinfo -h -N -o '%N %t' | grep -c ' idle')" = 2 ] ||
    fail "the two nodes never became idle: $(on_h1 sinfo -N 2>&1)"
echo "slurm: $(on_h1 sinfo -h -N -o '%N(%t)' | tr '\n' ' ')"

run="$work/run"
steps=40
every=4
# The ranks talk TCP over the cluster's subnet (and shared memory inside
# a host); the rest is deploy/slurm/train.sbatch as shipped, its #SBATCH
# lines overridden on the command line.
job=$(on_h1 env OMPI_MCA_btl=tcp,self,vader OMPI_MCA_btl_tcp_if_include=10.213.0.0/24 \
    OMPI_MCA_oob_tcp_if_include=10.213.0.0/24 APIARY="$apiary" RUN_DIR="$run" \
    sbatch --parsable -N 2 --ntasks-per-node=2 --cpus-per-task=1 --output="$work/job.out" \
    --chdir="$work" "$src/deploy/slurm/train.sbatch" \
    --set data.tokenizer=byte --set model.preset=tiny --set model.n_layer=4 \
    --set model.n_embd=128 --set model.n_head=4 --set parallel.dp=4 --set train.batch_size=1 \
    --set train.grad_accum=4 --set train.seq_len=64 --set train.steps=$steps \
    --set train.log_every=1 --set train.eval_every=100000 --set train.ckpt_every=$every \
    --set train.threads=1 --set comm.timeout_s=120) || fail "sbatch"
echo "submitted job $job"

# Once the job has a checkpoint past its first, h2 goes DOWN.
latest() { cat "$run/ckpt/latest" 2>/dev/null || true; }
for _ in $(seq 3000); do
    case $(latest) in step_0000000[8-9] | step_000000[1-9]?) break ;; esac
    sleep 0.2
done
before=$(latest)
[ -n "$before" ] && [ "$before" != step_00000004 ] || fail "the job never saved a second checkpoint"
[ "$(on_h1 squeue -h -j "$job" -o '%T %N')" = "RUNNING h[1-2]" ] ||
    fail "the job does not run on h1 and h2: $(on_h1 squeue -j "$job")"
t0=$(date +%s)
on_h1 scontrol update NodeName=h2 State=DOWN Reason=fault-test
echo "h2 set DOWN with $before the newest checkpoint"
# Slurm ends the job on both nodes and requeues it: pending, one restart.
for _ in $(seq 600); do
    st=$(on_h1 squeue -h -j "$job" -o %T 2>/dev/null || true)
    [ "$st" = PENDING ] && break
    sleep 0.2
done
[ "$st" = PENDING ] || fail "the job was not requeued (state '$st')"
on_h1 scontrol show job "$job" | grep -q "Restarts=1" ||
    fail "no restart counted: $(on_h1 scontrol show job "$job")"
t_requeued=$(($(date +%s) - t0))
echo "job $job requeued after ${t_requeued}s: $(on_h1 scontrol show job "$job" | grep -o 'Reason=[^ ]*')"
# The first run's step daemons gone (a launch while slurmd still tears
# one down is refused).
for _ in $(seq 300); do
    pgrep -f "slurmstepd: \[$job\." >/dev/null || break
    sleep 0.2
done
# h2 back; the requeued job is held for a while (its BeginTime): at once.
on_h1 scontrol update NodeName=h2 State=RESUME
sleep 1
on_h1 scontrol update JobId="$job" StartTime=now || true
for _ in $(seq 3000); do
    grep -q "apiary exited with .* (restart count 1)" "$work/job.out" 2>/dev/null && break
    sleep 0.2
done
t_total=$(($(date +%s) - t0))
grep -q "apiary exited with 0 (restart count 1)" "$work/job.out" || fail "the requeued run did not finish"
resumed=$(grep -o "resuming after step [0-9]*" "$work/job.out" | tail -n 1)
[ "$resumed" = "resuming after step $((10#${before#step_}))" ] ||
    [ "${resumed#resuming after step }" -ge "$((10#${before#step_}))" ] ||
    fail "the second run $resumed, before $before, the newest checkpoint when h2 went down"
# Every step once, in order, to the last.
logged=$(python3 -c '
import json, sys
print(" ".join(str(json.loads(l)["step"]) for l in open(sys.argv[1]) if "\"loss\"" in l))' \
    "$run/metrics.jsonl")
[ "$logged" = "$(seq -s ' ' 1 $steps)" ] || fail "steps logged: $logged"
"$apiary" ckpt verify "$run" || fail "the last checkpoint does not verify"
echo "slurm_node_down_test: h2 DOWN mid-job: requeued after ${t_requeued}s, $resumed" \
    "(newest checkpoint at the fault: $before), $steps steps done ${t_total}s after the fault"
