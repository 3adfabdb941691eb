#!/usr/bin/env bash
# Replays Slurm's own record of a batch of short jobs in the simulator.
# Starts a throw-away one-node Slurm (tests/slurm_cluster.sh: munge,
# slurmctld, slurmd in a temporary directory, ports 16837-16838, a node of 4
# CPUs), runs the same batch of
# eight `sleep` jobs under sched/backfill and under sched/builtin (FIFO),
# writing the job-completion log (JobCompType=jobcomp/filetxt) and reading
# it back with `sacct --completion --parsable2`. Then `apiary sim cluster`
# replays both records under the policy slurm.conf names, and the test
# checks that the simulated start and end orders are Slurm's and every
# start and end is within 2 s per scheduling wave of Slurm's (see compare);
# replaying each record under the other policy must fail that check.
#   slurm_replay_test.sh <apiary binary>
# Exit 0: replays match; 77: skipped (not root). Needs slurm-wlm, munge and
# python3 (scripts/install-deps.sh) and root (slurmd runs the job steps).
set -euo pipefail
apiary=$1
if [ "$(id -u)" -ne 0 ]; then
    echo "slurm_replay_test: skipped: needs root (slurmd runs the job steps)"
    exit 77
fi
for prog in munged slurmctld slurmd sbatch squeue sinfo sacct python3; do
    command -v "$prog" >/dev/null || { echo "slurm_replay_test: $prog missing (run scripts/install-deps.sh)"; exit 1; }
done

source "$(dirname "$0")/../slurm_cluster.sh"
# A node of 4 CPUs (more than this machine has: the jobs only sleep), no
# oversubscription, on ports of its own.
SLURM_TEST_PORT=16837 SLURM_TEST_CPUS=4 SLURM_TEST_PARTITION=

# The batch: CPUs, time limit (minutes), seconds of sleep. Job 2 needs the
# whole node and waits for job 1; under backfill, jobs 3 and 5 fit beside
# job 1 and end (by their limits) before job 2's reservation.
batch=(
    "2 3 8"
    "4 1 3"
    "1 1 4"
    "1 5 2"
    "1 1 3"
    "3 2 2"
    "1 1 5"
    "4 1 2"
)

run_batch() {  # run_batch <scheduler> <dir>
    local sched=$1 dir=$2
    mkdir -p "$dir"
    SLURM_TEST_SCHED=$sched SLURM_TEST_JOBCOMP=$dir/jobcomp.txt slurm_cluster_start "$dir"
    for job in "${batch[@]}"; do
        read -r cpus limit secs <<<"$job"
        sbatch -n "$cpus" -t "$limit" -o /dev/null --wrap "sleep $secs" >/dev/null
    done
    local deadline=$((SECONDS + 120))
    while [ -n "$(squeue -h 2>/dev/null)" ] || [ "$(wc -l < "$dir/jobcomp.txt" 2>/dev/null || echo 0)" -lt ${#batch[@]} ]; do
        if [ $SECONDS -gt $deadline ]; then
            echo "slurm_replay_test: jobs did not finish in 120 s under $sched"
            squeue || true
            exit 1
        fi
        sleep 0.5
    done
    sacct --completion --parsable2 \
        --format=JobID,Submit,Eligible,Start,End,Timelimit,NCPUS,State \
        >"$dir/sacct.txt"
    slurm_cluster_stop
}

replay() {  # replay <dir> <record file> <policy> -> <record>.<policy>.csv
    local dir=$1 rec=$2 policy=$3
    "$apiary" sim cluster --trace "$dir/$rec" --slurm-conf "$dir/slurm.conf" --latency-s auto \
        --policies "$policy" --jobs-out "$dir/$rec.$policy.csv" | grep -A1 "^replay\|latency" || true
}

# Compares a replay with Slurm's record: the start order and the end order
# the same for jobs more than 2 s apart in the record (its whole seconds and
# Slurm's reaction cannot order closer ones), and every start and end
# within 2 s per scheduling wave up to it. A wave is a second
# in which Slurm started jobs. Each adds Slurm's reaction (its controller's
# next tick after an arrival, or after a job's end and epilog), seen here
# between 0 and 3 s in whole seconds, where the replay adds its mean over
# the record; so each wave may add up to about 2 s of drift either way.
# Exit 1 when they differ (the negative controls expect that).
compare() {  # compare <jobs csv>
    python3 - "$1" <<'PY'
import csv, sys
rows = [r for r in csv.DictReader(open(sys.argv[1])) if r["recorded_start"]]
assert len(rows) == 8, f"{len(rows)} replayed jobs, expected 8"
rec_s = {r["id"]: float(r["recorded_start"]) for r in rows}
rec_e = {r["id"]: float(r["recorded_end"]) for r in rows}
sim_s = {r["id"]: float(r["start"]) for r in rows}
sim_e = {r["id"]: float(r["end"]) for r in rows}
waves = sorted(set(rec_s.values()))
def order_breaks(a, b):  # pairs more than 2 s apart in a, in the other order in b
    return [(x, y) for x in a for y in a if a[x] + 2 < a[y] and b[x] > b[y]]
problems = [f"start order: Slurm starts job {x} before job {y}, the replay after"
            for x, y in order_breaks(rec_s, sim_s)]
problems += [f"end order: Slurm ends job {x} before job {y}, the replay after"
             for x, y in order_breaks(rec_e, sim_e)]
worst = 0.0
for j in rec_s:
    tol = 2 * (1 + waves.index(rec_s[j]))
    err = max(abs(sim_s[j] - rec_s[j]), abs(sim_e[j] - rec_e[j]))
    worst = max(worst, err / tol)
    if err > tol:
        problems.append(f"job {j} is {err:.1f} s off (tolerance {tol} s)")
    print(f"  job {j}: Slurm {rec_s[j]:.0f}-{rec_e[j]:.0f}, simulated {sim_s[j]:.1f}-{sim_e[j]:.1f}, "
          f"tolerance {tol} s")
for p in problems[:3]:
    print(f"  differs: {p}")
print(f"  {'match' if not problems else 'no match'}; worst error {worst:.2f} of its tolerance")
sys.exit(1 if problems else 0)
PY
}

for sched in sched/backfill sched/builtin; do
    dir="$work/${sched#sched/}"
    echo "== $sched"
    run_batch "$sched" "$dir"
    policy=$([ "$sched" = sched/backfill ] && echo backfill || echo fifo)
    replay "$dir" jobcomp.txt "$policy"
    compare "$dir/jobcomp.txt.$policy.csv"
    # sacct --completion reads the same log: the same jobs, times and replay.
    replay "$dir" sacct.txt "$policy"
    compare "$dir/sacct.txt.$policy.csv"
    cut -d, -f1,4-7,18,19 "$dir/jobcomp.txt.$policy.csv" >"$dir/a.csv"
    cut -d, -f1,4-7,18,19 "$dir/sacct.txt.$policy.csv" >"$dir/b.csv"
    diff "$dir/a.csv" "$dir/b.csv"
done
# Negative controls: each record under the other policy does not match, so
# the comparison can fail and the two policies are told apart.
for pair in "backfill fifo" "builtin backfill"; do
    read -r sched policy <<<"$pair"
    echo "== the sched/$sched record replayed as $policy (must differ)"
    replay "$work/$sched" jobcomp.txt "$policy"
    if compare "$work/$sched/jobcomp.txt.$policy.csv"; then
        echo "slurm_replay_test: the $sched record also matches $policy: the check cannot tell"
        exit 1
    fi
done
echo "slurm_replay_test: both records replay in Slurm's order, within 2 s per scheduling wave"
