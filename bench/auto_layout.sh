#!/usr/bin/env bash
# parallel.layout = auto against every layout measured: on two hosts of
# tests/cluster/cluster.sh (two ranks each, one link per host shaped by tc),
# at each link rate, one small GPT is trained for a few steps in each of the
# layouts below and once with parallel.layout = auto (the fabric given to
# the planner by the same rate, a TCP efficiency of 0.95 and nic_shared);
# the table shows the measured median step of each, the one auto chose, and
# how far it is from the fastest measured. Must run as root.
#
# usage: bench/auto_layout.sh [OUTDIR] [STEPS]
# Environment:
#   RATES="50mbit 1gbit"   link rates, as tc writes them
#   CAL=FILE               plan.calibration for auto (from `apiary plan
#                          calibrate`, e.g. bench/calibrate_layouts.sh);
#                          default: the catalog's constants
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/auto-layout}
steps=${2:-12}
A=$PWD/build/apiary
C=$PWD/tests/cluster/cluster.sh
rates=${RATES:-50mbit 1gbit}
mkdir -p "$out"
out=$(cd "$out" && pwd)
export APIARY_CLUSTER_ID=${APIARY_CLUSTER_ID:-bauto} APIARY_CLUSTER_SUBNET=${APIARY_CLUSTER_SUBNET:-10.213.8}
export APIARY_CLUSTER_SLOTS=2
trap '"$C" down >/dev/null 2>&1 || true' EXIT

# The model of bench/calibrate_layouts.sh: 8 blocks of width 256, 8 heads,
# T = 128, 16 sequences per optimizer step, one thread per rank.
common=(--set model.preset=tiny --set model.n_layer=8 --set model.n_embd=256
        --set model.n_head=8 --set train.seq_len=128 --set train.steps="$steps"
        --set train.log_every=1 --set train.eval_every=0 --set train.eval_batches=1
        --set train.ckpt_every=0 --set train.warmup_steps=2 --set metrics.enabled=false
        --set train.threads=1 --set data.cache_dir="$out/cache" --overwrite)
# Every layout of 4 ranks the trainer takes for this model, global batch 16
# (ranks 0, 1 on h1 and 2, 3 on h2; tp is the fastest axis).
layouts=(
    "dp4|train.batch_size=4"
    "dp4-z1|train.batch_size=4 parallel.zero_stage=1"
    "dp4-z3|train.batch_size=4 parallel.zero_stage=3"
    "tp2dp2|parallel.tp=2 train.batch_size=8"
    "tp4|parallel.tp=4 train.batch_size=8 train.grad_accum=2"
    "pp2dp2|parallel.pp=2 train.batch_size=2 train.grad_accum=4"
    "tp2pp2|parallel.tp=2 parallel.pp=2 train.batch_size=4 train.grad_accum=4"
    "pp4-1f1b|parallel.pp=4 train.batch_size=2 train.grad_accum=8"
)

median_step() {
    python3 - "$1/metrics.jsonl" <<'PY'
import json, statistics, sys
t = [json.loads(l)["step_time_s"] for l in open(sys.argv[1]) if "step_time_s" in l]
print(statistics.median(t[max(1, len(t) // 4):]))
PY
}
train() {  # NAME RUN_DIR SETTINGS...
    local name=$1 dir=$2 sets=() kv
    shift 2
    for kv in "$@"; do sets+=(--set "$kv"); done
    "$C" mpirun -n 4 -x OMP_NUM_THREADS=1 "$A" train "${common[@]}" "${sets[@]}" \
        --set run.dir="$dir" >"$dir.log" 2>&1 || { tail -20 "$dir.log" >&2; exit 1; }
}

"$C" up 2 >/dev/null
echo "| link | layout | measured step | predicted (the planner auto asks) |"
echo "|---|---|---|---|"
for rate in $rates; do
    "$C" link all reset >/dev/null
    "$C" link all rate "$rate" >/dev/null
    fabric=(cluster.inter_link_rate="$rate" cluster.inter_link_efficiency=0.95
            cluster.nic_shared=true)
    [[ -n ${CAL:-} ]] && fabric+=(plan.calibration="$(realpath "$CAL")")
    pset=(--set cluster.gpus=4 --set cluster.gpus_per_node=2)
    for kv in "${fabric[@]}"; do pset+=(--set "$kv"); done
    declare -A step=() pred=()
    for entry in "${layouts[@]}"; do
        name=${entry%%|*}
        # shellcheck disable=SC2086
        train "$name" "$out/$rate-$name" ${entry#*|}
        step[$name]=$(median_step "$out/$rate-$name")
        # What the planner that auto asks predicts for this layout.
        pred[$name]=$("$A" plan --config "$out/$rate-$name/config.toml" "${pset[@]}" --json |
            python3 -c 'import json, sys; print(json.load(sys.stdin)["step_time_s"])')
    done
    train auto "$out/$rate-auto" parallel.layout=auto "${fabric[@]}" train.batch_size=4
    chosen=$(grep -o 'chose [^(]*' "$out/$rate-auto.log" | head -1 | sed 's/^chose //; s/ *$//')
    auto_step=$(median_step "$out/$rate-auto")
    best=$(for n in "${!step[@]}"; do echo "${step[$n]} $n"; done | sort -g | head -1)
    for n in "${!step[@]}"; do
        printf '| %s | %s | %.3f s | %.3f s (%+.0f%%) |\n' "$rate" "$n" "${step[$n]}" "${pred[$n]}" \
            "$(python3 -c "print(100 * (${pred[$n]} / ${step[$n]} - 1))")"
    done | sort -t'|' -k4
    printf '| %s | auto: %s | %.3f s | |\n' "$rate" "$chosen" "$auto_step"
    python3 -c "
b, n = '$best'.split(); a = float('$auto_step')
print(f'| $rate | fastest measured: {n} | {float(b):.3f} s | auto / fastest = {a / float(b):.2f} |')"
    unset step pred
done
