#!/usr/bin/env bash
# A mixture-of-experts model against the dense model with the same active
# parameters, on the default corpus (the KJV under the default BPE), for the
# same tokens: the default tiny GPT (4 x 192, MLP width 768) against the
# same model whose MLPs are 8 experts of width 384, 2 per token (the dense
# MLP's matmul parameters per token, plus the 8 x 192 router; 4x the MLP
# parameters in all). Reports tokens/s (median of the logged windows after
# the first 10% of steps), the training loss of the last window and the
# held-out loss at the end, and the expert-load imbalance of the MoE run.
# Dense and MoE runs alternate, round after round, so that a change in the
# machine's load hits both.
#
# usage: bench/moe_vs_dense.sh [OUTDIR] [STEPS]
#   OUTDIR  run directories (default runs/moe_vs_dense)
#   STEPS   optimizer steps per run (default 300, 2048 tokens each)
# Environment: ROUNDS=2 (rounds of dense + MoE), MOE_ARGS (extra --set
# arguments for the MoE run, e.g. "--set model.moe_dropless=true"), APIARY
# (the binary, default ./build/apiary), MOE_BASELINE (a second binary: each
# round also runs the MoE model with it, as "moe-base", for a before/after).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/moe_vs_dense}
steps=${2:-300}
rounds=${ROUNDS:-2}
A=${APIARY:-./build/apiary}
mkdir -p "$out"

common=(--set model.preset=tiny --set train.steps="$steps" --set train.log_every=10
        --set train.eval_every="$steps" --set train.ckpt_every=0 --set metrics.enabled=false
        --set profile.steps= --overwrite)
dense=(--set model.ffn_hidden=768)
# shellcheck disable=SC2206
moe=(--set model.n_expert=8 --set model.n_expert_active=2 --set model.moe_ffn_hidden=384
     ${MOE_ARGS:-})

echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq 1 "$rounds"); do
    names=(dense moe)
    [ -n "${MOE_BASELINE:-}" ] && names+=(moe-base)
    for name in "${names[@]}"; do
        if [ "$name" = dense ]; then args=("${dense[@]}"); else args=("${moe[@]}"); fi
        bin=$A
        [ "$name" = moe-base ] && bin=$MOE_BASELINE
        dir="$out/round$r/$name"
        mkdir -p "$out/round$r"
        start=$(date +%s.%N)
        "$bin" train --set run.dir="$dir" "${common[@]}" "${args[@]}" > "$dir.log" 2>&1 ||
            { echo "$name (round $r) failed: see $dir.log"; tail -5 "$dir.log"; exit 1; }
        echo "round $r $name: $(echo "$(date +%s.%N) - $start" | bc) s wall;" \
            "$(grep -o 'matmul peak [0-9.]* GFLOP/s' "$dir.log");" \
            "load $(cut -d' ' -f1-3 /proc/loadavg)"
    done
done

python3 - "$out" "$rounds" "$steps" <<'PY'
import json, os, statistics, sys
out, rounds, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
print(f"{'run':<14}{'tok/s':>9}{'train loss':>12}{'val loss':>10}{'imbalance':>11}{'peak MiB':>10}")
for r in range(1, rounds + 1):
    for name in ("dense", "moe", "moe-base"):
        if not os.path.exists(f"{out}/round{r}/{name}/metrics.jsonl"):
            continue
        recs = [json.loads(l) for l in open(f"{out}/round{r}/{name}/metrics.jsonl")]
        steps_ = [j for j in recs if "loss" in j and "tokens_per_s" in j]
        tps = statistics.median(j["tokens_per_s"] for j in steps_ if j["step"] > steps // 10)
        val = [j["eval_loss"] for j in recs if "eval_loss" in j]
        imb = [m["imbalance"] for j in steps_[-1:] for m in j.get("moe", [])]
        peak = sum(next((j["memory_peak_bytes_per_rank"] for j in recs
                         if "memory_peak_bytes_per_rank" in j), {}).values()) / 2**20
        print(f"{name + ' r' + str(r):<14}{tps:>9.0f}{steps_[-1]['loss']:>12.4f}"
              f"{val[-1] if val else float('nan'):>10.4f}"
              f"{(max(imb) if imb else 1.0):>11.2f}{peak:>10.1f}")
PY
