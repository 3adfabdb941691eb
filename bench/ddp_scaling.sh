#!/usr/bin/env bash
# Data-parallel scaling on one machine: `apiary bench ddp` with 1 rank of 1
# thread, then 2 ranks of 1 thread, on the same global batch, alternating
# so that both see the same machine. Prints each run's JSON, then per round
# the scaling efficiency (t1 / (2 t2)) and the fraction of gradient
# communication hidden behind backward at the given bucket size.
# usage: bench/ddp_scaling.sh [preset] [global_batch] [seq] [rounds] [bucket_mb]
set -euo pipefail
cd "$(dirname "$0")/.."
preset=${1:-gpt2-124m} batch=${2:-8} seq=${3:-128} rounds=${4:-3} bucket=${5:-25}
mpirun=(mpirun --allow-run-as-root --oversubscribe --bind-to none)
args=(--preset "$preset" --global-batch "$batch" --seq "$seq" --threads 1 --steps 4 --warmup 1
      --bucket-mb "$bucket" --json)
for r in $(seq "$rounds"); do
    one=$(./build/apiary bench ddp "${args[@]}")
    two=$("${mpirun[@]}" -n 2 ./build/apiary bench ddp "${args[@]}")
    echo "$one"
    echo "$two"
    python3 -c '
import json, sys
a, b = json.loads(sys.argv[1]), json.loads(sys.argv[2])
print(json.dumps({"round": int(sys.argv[3]),
                  "scaling_efficiency": a["step_time_s"] / (2 * b["step_time_s"]),
                  "comm_hidden_fraction": b["comm_hidden_fraction"],
                  "comm_alone_s": b["comm_alone_s"], "comm_exposed_s": b["comm_exposed_s"]}))
' "$one" "$two" "$r"
done
