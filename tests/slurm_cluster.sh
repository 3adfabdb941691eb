# Sourced by the tests that need Slurm: throw-away one-node clusters (munge,
# slurmctld, slurmd), all in a temporary directory $work, stopped and
# removed when the sourcing script exits (KEEP=1 keeps $work). Needs root
# (slurmd runs job steps as their user) and slurm-wlm and munge
# (scripts/install-deps.sh).
#
#   slurm_cluster_start DIR   writes DIR/slurm.conf, starts slurmctld and
#                             slurmd on it (and munged, once), waits for the
#                             node to be idle, exports SLURM_CONF
#   slurm_cluster_stop        stops that slurmctld and slurmd (munged stays,
#                             so another cluster can start after it)
#
# Settings, read by slurm_cluster_start (defaults in brackets):
#   SLURM_TEST_PORT       slurmctld's port; slurmd takes the next [16817]
#   SLURM_TEST_CPUS       the node's CPUs; more than the machine has is
#                         allowed (SlurmdParameters=config_overrides) [nproc]
#   SLURM_TEST_SCHED      SchedulerType [sched/builtin]
#   SLURM_TEST_JOBCOMP    a job-completion log (jobcomp/filetxt); empty: none
#   SLURM_TEST_PARTITION  extra options of the partition [OverSubscribe=YES]
# Tests that may run at the same time use different ports.
source "$(dirname "${BASH_SOURCE[0]}")/slurm_lib.sh"
work=$(mktemp -d /tmp/apiary-slurm.XXXXXX)
slurm_pids=()
munge_pid=
slurm_cluster_stop() {
    for p in "${slurm_pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${slurm_pids[@]}"; do wait "$p" 2>/dev/null || true; done
    slurm_pids=()
    unset SLURM_CONF
}
slurm_cluster_cleanup() {
    slurm_cluster_stop
    if [ -n "$munge_pid" ]; then
        kill "$munge_pid" 2>/dev/null || true
        wait "$munge_pid" 2>/dev/null || true
    fi
    if [ -n "${KEEP:-}" ]; then echo "kept $work"; else rm -rf "$work" || true; fi
}
trap slurm_cluster_cleanup EXIT

# munge: its own key, socket and files, so a system munged is not disturbed.
slurm_munge_start() {
    [ -n "$munge_pid" ] && return 0
    slurm_munged "$work"
}

slurm_cluster_start() {  # slurm_cluster_start DIR
    local dir=$1 host port jobcomp
    host=$(hostname -s)
    port=${SLURM_TEST_PORT:-16817}
    jobcomp="JobCompType=jobcomp/none"
    if [ -n "${SLURM_TEST_JOBCOMP:-}" ]; then
        jobcomp="JobCompType=jobcomp/filetxt
JobCompLoc=$SLURM_TEST_JOBCOMP"
    fi
    slurm_munge_start
    mkdir -p "$dir/state" "$dir/spool"
    cat > "$dir/slurm.conf" <<CONF
ClusterName=apiarytest
SlurmctldHost=$host
SlurmctldPort=$port
SlurmdPort=$((port + 1))
$(slurm_conf_auth "$work/munge/munge.socket")
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
$(slurm_conf_plugins)
ReturnToService=2
SchedulerType=${SLURM_TEST_SCHED:-sched/builtin}
SchedulerParameters=bf_interval=1,sched_min_interval=0
$jobcomp
AccountingStorageType=accounting_storage/none
NodeName=$host CPUs=${SLURM_TEST_CPUS:-$(nproc)} State=UNKNOWN
PartitionName=test Nodes=$host Default=YES MaxTime=INFINITE State=UP ${SLURM_TEST_PARTITION-OverSubscribe=YES}
CONF
    export SLURM_CONF="$dir/slurm.conf"
    slurmctld -D -i -f "$SLURM_CONF" >"$dir/slurmctld.out" 2>&1 &
    slurm_pids+=($!)
    slurmd -D -f "$SLURM_CONF" >"$dir/slurmd.out" 2>&1 &
    slurm_pids+=($!)
    for i in $(seq 100); do
        sinfo -h -o %t 2>/dev/null | grep -q idle && return 0
        sleep 0.3
    done
    echo "slurm_cluster: the node never became idle (${SLURM_TEST_SCHED:-sched/builtin})"
    tail -n 20 "$dir/slurmctld.log" "$dir/slurmd.log" 2>/dev/null || true
    exit 1
}
