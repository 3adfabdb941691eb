#!/usr/bin/env bash
# Every layout of 4 ranks on one model: `apiary bench parallel` under mpirun
# (1 thread per rank), beside the planner's prediction of the same layout's
# memory per rank and pipeline bubble (`apiary plan --json`). Prints each
# run's JSON line, then one table row per layout. The planner's bubble of a
# pipeline is the share of the schedule its least busy stage idles, what the
# replayed bubble measures. Its memory is what the trainer's allocator counts
# (the total less the runtime's own, which the allocator does not see).
# usage: bench/parallel_layouts.sh [preset] [global_batch] [seq] [precision]
# LAYOUTS=REGEX runs only the layouts whose name matches (e.g. LAYOUTS=pp,
# LAYOUTS='^dp4 zero[13]$'); APIARY=path runs another binary than
# ./build/apiary.
set -euo pipefail
cd "$(dirname "$0")/.."
preset=${1:-gpt2-124m} batch=${2:-8} seq=${3:-128} precision=${4:-fp32}
apiary=${APIARY:-./build/apiary}
mpirun=(mpirun --allow-run-as-root --oversubscribe --bind-to none -n 4)
common=(--preset "$preset" --global-batch "$batch" --seq "$seq" --threads 1 --steps 3 --warmup 1
        --precision "$precision" --json)
# name | bench parallel flags | planner keys (dp x tp x pp = 4)
layouts=(
  "dp4|--zero-stage 0|parallel.dp=4"
  "dp4 zero1|--zero-stage 1|parallel.dp=4 parallel.zero_stage=1"
  "dp4 zero3|--zero-stage 3|parallel.dp=4 parallel.zero_stage=3"
  "tp4|--tp 4|parallel.tp=4"
  "tp2 dp2|--tp 2|parallel.tp=2 parallel.dp=2"
  "tp2 dp2 sp|--tp 2 --sequence-parallel|parallel.tp=2 parallel.dp=2 parallel.sequence_parallel=true"
  "tp2 dp2 selective|--tp 2 --recompute selective|parallel.tp=2 parallel.dp=2 parallel.recompute=selective"
  "tp2 dp2 full|--tp 2 --recompute full|parallel.tp=2 parallel.dp=2 parallel.recompute=full"
  "pp4 1f1b m8|--pp 4 --microbatches 8|parallel.pp=4 parallel.microbatches=8"
  "pp4 gpipe m8|--pp 4 --microbatches 8 --schedule gpipe|parallel.pp=4 parallel.microbatches=8 parallel.schedule=gpipe"
  "pp2 interleaved v2 m4 dp2|--pp 2 --microbatches 4 --schedule interleaved --virtual-stages 2|parallel.pp=2 parallel.dp=2 parallel.microbatches=4 parallel.schedule=interleaved parallel.virtual_stages=2"
  "pp2 dp2 m4|--pp 2 --microbatches 4|parallel.pp=2 parallel.dp=2 parallel.microbatches=4"
  "tp2 pp2 m4|--tp 2 --pp 2 --microbatches 4|parallel.tp=2 parallel.pp=2 parallel.microbatches=4"
)
rows=()
for l in "${layouts[@]}"; do
    IFS='|' read -r name flags keys <<<"$l"
    [[ -n "${LAYOUTS:-}" && ! "$name" =~ $LAYOUTS ]] && continue
    # shellcheck disable=SC2086
    run=$("${mpirun[@]}" "$apiary" bench parallel "${common[@]}" $flags)
    echo "$run"
    sets=()
    for k in $keys; do sets+=(--set "$k"); done
    dp=$(python3 -c 'import sys; print(next((k.split("=")[1] for k in sys.argv[1:] if k.startswith("parallel.dp=")), 1))' $keys)
    mb=$(python3 -c 'import sys; print(next((k.split("=")[1] for k in sys.argv[1:] if k.startswith("parallel.microbatches=")), 1))' $keys)
    plan=$("$apiary" plan --json --model "$preset" --gpus 4xepyc-zen5-2c \
        --set train.batch_size=$((batch / dp / mb)) --set train.grad_accum="$mb" \
        --set train.seq_len="$seq" --set train.precision="$precision" "${sets[@]}")
    rows+=("$(python3 - "$name" "$run" "$plan" <<'PY'
import json, sys
name, run, plan = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
peak = max(r["peak_bytes"]["total"] for r in run["per_rank"]) / 2**30
tp_mb = max(r["tp_bytes"] for r in run["per_rank"]) / 1e6
pp_mb = max(r["pp_bytes"] for r in run["per_rank"]) / 1e6
print(f"| {name} | {run['step_time_s']:.2f} | {run['tokens_per_s']:.0f} | {peak:.2f} | "
      f"{plan['memory_gib']['total'] - plan['memory_gib'].get('runtime', 0):.2f} | "
      f"{100*run['ideal_bubble']:.1f}% | "
      f"{100*run['replayed_bubble_max']:.1f}% | {100*run['bubble_max']:.1f}% | "
      f"{100*plan.get('stage_idle_max', 0):.1f}% | {tp_mb:.0f} | {pp_mb:.0f} |")
PY
)")
done
echo "| layout | step s | tok/s | peak GiB/rank (max) | planner GiB | ideal bubble | replayed bubble | measured bubble (max rank) | planner bubble | tp MB/rank | pp MB/rank |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
