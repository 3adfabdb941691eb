#!/usr/bin/env bash
# Expert parallelism: the same MoE model (the default tiny GPT, 4 x 192,
# its MLPs 8 experts of width 384, 2 per token) on 4 data-parallel ranks
# with ep 1, 2 and 4, the same global batch. Reports, per run, the median
# step time and its parts on rank 0 over the steps after the first 5:
# compute (forward + backward, communication left out), the expert
# all-to-alls (ep_comm_s: dispatch and return, forward and backward), the
# gradient sync not hidden behind backward (comm_exposed_s) and the
# optimizer; and the sgemm peak each run measured at start. The layouts
# alternate, round after round, so that a change in the machine's load
# hits all of them.
#
# usage: bench/moe_ep.sh [OUTDIR] [STEPS]
#   OUTDIR  run directories (default runs/moe_ep)
#   STEPS   optimizer steps per run (default 30)
# Environment: ROUNDS=2, RANKS=4, EPS="1 2 4" (the ep values, each dividing
# RANKS and 8), APIARY (default ./build/apiary), MPIRUN
# (default "mpirun --oversubscribe --bind-to none"), EXTRA (more --set
# arguments for every run).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/moe_ep}
steps=${2:-30}
rounds=${ROUNDS:-2}
ranks=${RANKS:-4}
eps=${EPS:-1 2 4}
A=${APIARY:-./build/apiary}
# shellcheck disable=SC2206
mpirun=(${MPIRUN:-mpirun --oversubscribe --bind-to none})
mkdir -p "$out"

# shellcheck disable=SC2206
common=(--set model.preset=tiny --set model.n_expert=8 --set model.n_expert_active=2
        --set model.moe_ffn_hidden=384 --set train.steps="$steps" --set train.log_every=1
        --set train.eval_every="$steps" --set train.eval_batches=1 --set train.ckpt_every=0
        --set train.seq_len=128 --set train.batch_size=2 --set train.threads=1
        --set parallel.dp="$ranks" --set profile.steps= --overwrite ${EXTRA:-})

echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, $ranks ranks;" \
     "load $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq 1 "$rounds"); do
    for ep in $eps; do
        dir="$out/round$r/ep$ep"
        mkdir -p "$out/round$r"
        "${mpirun[@]}" -n "$ranks" "$A" train --set run.dir="$dir" "${common[@]}" \
            --set parallel.ep="$ep" > "$dir.log" 2>&1 ||
            { echo "ep $ep (round $r) failed: see $dir.log"; tail -5 "$dir.log"; exit 1; }
        echo "round $r ep $ep: $(grep -o 'matmul peak [0-9.]* GFLOP/s' "$dir.log");" \
             "load $(cut -d' ' -f1-3 /proc/loadavg)"
    done
done

python3 - "$out" "$rounds" "$eps" <<'PY'
import json, statistics, sys
out, rounds, eps = sys.argv[1], int(sys.argv[2]), [int(e) for e in sys.argv[3].split()]
keys = [("step_time_s", "step"), ("step_compute_s", "compute"), ("ep_comm_s", "all-to-all"),
        ("comm_exposed_s", "grad sync"), ("optimizer_s", "optimizer")]
print(f"{'run':<10}" + "".join(f"{h + ' ms':>15}" for _, h in keys) + f"{'final loss':>12}")
for r in range(1, rounds + 1):
    for ep in eps:
        recs = [json.loads(l) for l in open(f"{out}/round{r}/ep{ep}/metrics.jsonl")]
        steps = [j for j in recs if "loss" in j and "step_compute_s" in j][5:]
        med = lambda k: 1e3 * statistics.median(j.get(k, 0.0) for j in steps)
        print(f"{'ep' + str(ep) + ' r' + str(r):<10}" + "".join(f"{med(k):>15.1f}" for k, _ in keys)
              + f"{steps[-1]['loss']:>12.4f}")
PY
