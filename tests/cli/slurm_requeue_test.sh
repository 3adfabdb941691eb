#!/usr/bin/env bash
# Preemption under Slurm: a batch job submitted with --requeue and
# --signal=B:USR1@60 gets SIGUSR1 (sent here at once with `scancel --signal
# --batch`, as Slurm sends it 60 s before the time limit or a preemption);
# the job script forwards it to `apiary train`, which finishes its step,
# saves a checkpoint and exits 130; the script requeues the job; the second
# run continues from the checkpoint (--auto-resume) and finishes.
#   slurm_requeue_test.sh <apiary binary>
set -euo pipefail
apiary=$1
if [ "$(id -u)" -ne 0 ]; then
    echo "slurm_requeue_test: skipped: needs root (slurmd runs the job steps)"
    exit 77
fi
source "$(dirname "$0")/../slurm_cluster.sh"
slurm_cluster_start "$work"

run="$work/run"
cat > "$work/job.sh" <<JOB
#!/bin/bash
#SBATCH -n 1 --requeue --signal=B:USR1@60 --open-mode=append --output=$work/job.out
# deploy/slurm/train.sbatch in miniature: forward the warning, requeue on 130.
"$apiary" train --auto-resume --set run.dir=$run --set data.tokenizer=byte \\
    --set model.n_layer=2 --set train.batch_size=2 --set train.seq_len=64 \\
    --set train.steps=600 --set train.log_every=100 --set train.threads=1 &
child=\$!
trap 'kill -USR1 \$child' USR1
wait \$child; rc=\$?
while kill -0 \$child 2>/dev/null; do wait \$child; rc=\$?; done
echo "apiary exited with \$rc (restart count \${SLURM_RESTART_COUNT:-0})"
if [ \$rc -eq 130 ]; then scontrol requeue \$SLURM_JOB_ID; fi
exit \$rc
JOB
job=$(sbatch --parsable "$work/job.sh")
echo "submitted job $job"
for i in $(seq 600); do [ -f "$run/metrics.jsonl" ] && break; sleep 0.2; done
[ -f "$run/metrics.jsonl" ] || { echo "the job never started training"; cat "$work/job.out"; exit 1; }
scancel --signal=USR1 --batch "$job"
# The job is requeued. Slurm holds a requeued job back for a while (its
# BeginTime); the test lets it start at once.
for i in $(seq 300); do
    [ "$(squeue -h -j "$job" -o %T 2>/dev/null)" = PENDING ] && break
    sleep 0.2
done
# Only once the first run's step daemon is gone: a launch while slurmd is
# still tearing it down is refused ("already killed, do not launch").
for i in $(seq 150); do
    pgrep -f "slurmstepd: \[$job\.batch\]" >/dev/null || break
    sleep 0.2
done
sleep 1
scontrol update JobId="$job" StartTime=now || true
# It runs again and completes. Waited for by the job's own last line: an
# empty or failed `squeue` (slurmctld busy a moment) is not the end.
for i in $(seq 1500); do
    grep -q "apiary exited with .* (restart count 1)" "$work/job.out" 2>/dev/null && break
    sleep 0.2
done
cat "$work/job.out"
grep -q "interrupted after step" "$work/job.out"
grep -q "apiary exited with 130 (restart count 0)" "$work/job.out"
grep -q "resuming after step" "$work/job.out"
grep -q "apiary exited with 0 (restart count 1)" "$work/job.out"
grep -q "done: 600 steps" "$work/job.out"
"$apiary" ckpt verify "$run"
echo "slurm_requeue_test: the job checkpointed on SIGUSR1, was requeued and finished"
