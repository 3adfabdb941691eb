#!/usr/bin/env bash
# The planner against this machine's own runs of many parallel layouts:
# short training runs of one small GPT on 4 ranks (data, tensor and pipeline
# parallelism with GPipe, 1F1B and interleaved schedules, ZeRO 1-3, selective
# and full recomputation), `apiary plan calibrate` on a few of them, and the
# others predicted without having been seen.
#
# usage: bench/calibrate_layouts.sh [OUTDIR] [STEPS]
#   OUTDIR  run directories and calibration.toml (default runs/layouts)
#   STEPS   optimizer steps per run (default 20; the first 10% are warm-up)
# Environment:
#   ROUNDS=3   train every layout this many times, round after round, into
#              OUTDIR/roundK/NAME; OUTDIR/NAME links the run whose median step
#              time is the median of its rounds (the machine drifts between
#              rounds by more than the layouts differ)
#   CALIBRATE_ON="dp4 tp4 pp4-1f1b dp4-z3"   the fitted runs
#   ONLY="dp4 tp4"   train only these (the others must exist from before)
#   TRAIN=0    train nothing, only pick and calibrate
#   RECORD=DIR also copy each picked run's config.toml and metrics.jsonl to
#              DIR, without comments or this machine's paths and with the
#              tokenizer's vocabulary written into model.vocab_size (the test
#              data of tests/plan/layouts_test.cc)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/layouts}
steps=${2:-20}
A=./build/apiary
mkdir -p "$out"

# One model for every layout: 8 blocks of width 256 with 8 heads (tp 2 and 4
# divide the heads, pp 4 x 2 virtual stages divide the blocks), T = 128,
# 16 sequences per optimizer step. Each rank has one thread: 4 ranks share
# the 2 cores.
common=(--set model.preset=tiny --set model.n_layer=8 --set model.n_embd=256
        --set model.n_head=8 --set train.seq_len=128 --set train.steps="$steps"
        --set train.log_every=1 --set train.eval_every=0 --set train.eval_batches=1
        --set train.ckpt_every=0 --set train.warmup_steps=2 --set metrics.enabled=false
        --set profile.steps= --overwrite)

# name | settings (global batch 16 = dp x batch_size x grad_accum)
layouts=(
    "dp4|train.batch_size=4"
    "dp4-acc|train.batch_size=2 train.grad_accum=2"
    "dp4-z1|train.batch_size=4 parallel.zero_stage=1"
    "dp4-z2|train.batch_size=2 train.grad_accum=2 parallel.zero_stage=2"
    "dp4-z3|train.batch_size=4 parallel.zero_stage=3"
    "dp4-full|train.batch_size=4 parallel.recompute=full"
    "tp2dp2|parallel.tp=2 train.batch_size=8"
    "tp2dp2-sel|parallel.tp=2 train.batch_size=8 parallel.recompute=selective"
    "tp4|parallel.tp=4 train.batch_size=8 train.grad_accum=2"
    "pp2dp2|parallel.pp=2 train.batch_size=2 train.grad_accum=4"
    "pp4-1f1b|parallel.pp=4 train.batch_size=2 train.grad_accum=8"
    "pp4-gpipe|parallel.pp=4 parallel.schedule=gpipe train.batch_size=2 train.grad_accum=8"
    "pp2dp2-int|parallel.pp=2 parallel.schedule=interleaved parallel.virtual_stages=2 train.batch_size=2 train.grad_accum=4"
    "pp4-int|parallel.pp=4 parallel.schedule=interleaved parallel.virtual_stages=2 train.batch_size=2 train.grad_accum=8"
    "tp2pp2|parallel.tp=2 parallel.pp=2 train.batch_size=4 train.grad_accum=4"
)

# Timings under someone else's load are not this machine's. Before the
# first run, wait (up to 30 minutes) for the 1-minute load average to fall
# below LOAD_MAX (0.8); before each run, until the cores were idle over 2 s
# (our own previous run still weighs on the load average). A run during
# which other processes took more than 0.1 core, or the hypervisor stole
# more than 0.1 core, is repeated (up to 3 tries); each run's figures go to
# OUTDIR/conditions.txt (round, layout, foreign cores, steal cores, load).
busy_ticks() { awk '/^cpu /{print $2 + $3 + $4 + $7 + $8}' /proc/stat; }
busy_pct() {
    local a b i0 i1
    a=$(busy_ticks) i0=$(awk '/^cpu /{print $5}' /proc/stat)
    sleep 2
    b=$(busy_ticks) i1=$(awk '/^cpu /{print $5}' /proc/stat)
    echo $((100 * (b - a) / (b - a + i1 - i0 + 1)))
}
wait_quiet() {
    local deadline=$((SECONDS + 1800))
    while (( SECONDS < deadline )); do
        if [[ $1 == load ]]; then
            awk -v m="${LOAD_MAX:-0.8}" '{exit !($1 < m)}' /proc/loadavg && return 0
        else
            (( $(busy_pct) < 15 )) && return 0
        fi
        sleep 10
    done
    echo "the machine stayed busy for 30 minutes ($(cat /proc/loadavg)); going on, each run" \
        "checked for foreign CPU time" >&2
}
# Trains layout $1 with settings $2 into $3; prints the CPU time (cores)
# the machine spent beyond the run's own (every rank's, from /usr/bin/time)
# and the time the hypervisor took from it (steal), over the run's wall time.
busy_steal() { awk '/^cpu /{print $2 + $3 + $4 + $7 + $8, $9}' /proc/stat; }
run_once() {
    local dir=$3 sets=() kv b0 s0 b1 s1 w0 w1
    for kv in $2; do sets+=(--set "$kv"); done
    read -r b0 s0 < <(busy_steal)
    w0=$(date +%s.%N)
    /usr/bin/time -f "%U %S" -o "$dir.cpu" $A launch -n 4 -- train "${common[@]}" \
        "${sets[@]}" --set run.dir="$dir" >"$dir.log" 2>&1 || { tail -20 "$dir.log" >&2; exit 1; }
    read -r b1 s1 < <(busy_steal)
    w1=$(date +%s.%N)
    awk -v d=$((b1 - b0)) -v st=$((s1 - s0)) -v w="$w0 $w1" '{own = ($1 + $2) * 100}
        END {split(w, t, " "); f = (d - own) / (100 * (t[2] - t[1]));
             printf "%.3f %.3f\n", f < 0 ? 0 : f, st / (100 * (t[2] - t[1]))}' "$dir.cpu"
}

rounds=${ROUNDS:-1}
if [[ ${TRAIN:-1} != 0 ]]; then
    wait_quiet load
    for round in $(seq "$rounds"); do
        mkdir -p "$out/round$round"
        for entry in "${layouts[@]}"; do
            name=${entry%%|*}
            if [[ -n ${ONLY:-} && " $ONLY " != *" $name "* ]]; then continue; fi
            for try in 1 2 3; do
                wait_quiet idle
                load=$(cut -d' ' -f1-3 /proc/loadavg)
                res=$(run_once "$name" "${entry#*|}" "$out/round$round/$name")
                read -r foreign steal <<<"$res"
                echo "== round $round $name: try $try, load average before $load," \
                    "foreign CPU $foreign cores, steal $steal cores" >&2
                awk -v f="$foreign" -v s="$steal" 'BEGIN {exit !(f < 0.1 && s < 0.1)}' && break
            done
            echo "$round $name $foreign $steal $load" >>"$out/conditions.txt"
        done
    done
fi

# Per layout, the round whose median step time is the median of the rounds.
for entry in "${layouts[@]}"; do
    name=${entry%%|*}
    pick=$(python3 - "$out"/round*/"$name" <<'PY'
import json, statistics, sys
def median_step(d):
    t = [json.loads(l)["step_time_s"] for l in open(d + "/metrics.jsonl") if "step_time_s" in l]
    return statistics.median(t[max(1, len(t) // 10):])
runs = sorted((median_step(d), d) for d in sys.argv[1:])
print(runs[(len(runs) - 1) // 2][1])
PY
)
    ln -sfn "${pick#"$out"/}" "$out/$name"
done

fit=${CALIBRATE_ON:-dp4 tp4 pp4-1f1b dp4-z3}
fitted=() held=()
for entry in "${layouts[@]}"; do
    name=${entry%%|*}
    if [[ " $fit " == *" $name "* ]]; then fitted+=("$out/$name"); else held+=("$out/$name"); fi
done
$A plan calibrate "${fitted[@]}" --holdout "${held[@]}" --out "$out/calibration.toml"

if [[ -n ${RECORD:-} ]]; then
    for entry in "${layouts[@]}"; do
        name=${entry%%|*}
        mkdir -p "$RECORD/$name"
        cp "$out/$name/metrics.jsonl" "$RECORD/$name/"
        python3 - "$out/$name" "$RECORD/$name/config.toml" <<'PY'
import json, re, sys
run, dest = sys.argv[1], sys.argv[2]
tok = json.load(open(run + "/tokenizer.json"))
vocab = 1 + max(list(tok["model"]["vocab"].values()) + [t["id"] for t in tok["added_tokens"]])
keep, section = [], ""
for line in open(run + "/config.toml"):
    line = line.rstrip("\n")
    if line.startswith("#") or not line.strip():
        continue
    if line.startswith("["):
        section = line.strip("[]")
        keep.append(line)
        continue
    key = line.split("=")[0].strip()
    if (section, key) in {("run", "dir"), ("data", "cache_dir")}:
        continue  # this machine's paths
    if (section, key) == ("model", "vocab_size") and line.split("=")[1].strip() == "0":
        line = f"vocab_size = {vocab}"
    keep.append(line)
open(dest, "w").write("\n".join(keep) + "\n")
PY
    done
fi
