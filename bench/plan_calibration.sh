#!/usr/bin/env bash
# The planner against this machine's own training runs: six short runs of the
# trainer (two model shapes x 1, 2, 4 ranks, one with ZeRO-1), calibrate on
# the 1- and 2-rank runs, then predict the held-out 4-rank runs.
# usage: bench/plan_calibration.sh [OUTDIR]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/calibration}
mkdir -p "$out"
A=./build/apiary
M=(mpirun --allow-run-as-root --oversubscribe --bind-to none)
common=(--overwrite --set train.steps=30 --set train.log_every=1 --set train.eval_every=0
        --set train.eval_batches=1 --set train.seq_len=128)
mid=(--set model.n_layer=6 --set model.n_embd=256 --set model.n_head=8)
$A train "${common[@]}" --set run.dir="$out/t1" --set train.batch_size=8 >/dev/null
"${M[@]}" -n 2 $A train "${common[@]}" --set run.dir="$out/t2" --set train.batch_size=4 >/dev/null
"${M[@]}" -n 4 $A train "${common[@]}" --set run.dir="$out/t4" --set train.batch_size=2 >/dev/null
$A train "${common[@]}" "${mid[@]}" --set run.dir="$out/m1" --set train.batch_size=8 >/dev/null
"${M[@]}" -n 2 $A train "${common[@]}" "${mid[@]}" --set run.dir="$out/m2" --set train.batch_size=4 \
    --set parallel.zero_stage=1 >/dev/null
"${M[@]}" -n 4 $A train "${common[@]}" "${mid[@]}" --set run.dir="$out/m4" --set train.batch_size=2 >/dev/null
$A plan calibrate "$out/t1" "$out/t2" "$out/m1" "$out/m2" --out "$out/calibration.toml"
for r in t4 m4; do
    predicted=$($A plan --config "$out/$r/config.toml" --gpus 4xepyc-zen5-2c \
        --calibration "$out/calibration.toml" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["step_time_s"])')
    measured=$(python3 -c "
import json, statistics
s = [json.loads(l)['step_time_s'] for l in open('$out/$r/metrics.jsonl') if 'step_time_s' in l][3:]
print(statistics.median(s))")
    python3 -c "print('$r (held out): predicted %.4f s, measured %.4f s, error %+.1f%%' % ($predicted, $measured, 100 * ($predicted / $measured - 1)))"
done
