#!/usr/bin/env bash
# `apiary bench parallel` of two binaries (an older commit's and this one)
# under mpirun, run alternately in one script so that both see the same
# machine; prints each run's JSON line and, per round, new / old step time.
# usage: bench/compare_parallel.sh OLD_APIARY NEW_APIARY [rounds] [ranks] [bench parallel options...]
set -euo pipefail
old=$1 new=$2 rounds=${3:-4} ranks=${4:-2}
shift 4 || shift $#
mpirun=(mpirun --allow-run-as-root --oversubscribe --bind-to none -n "$ranks")
args=(--preset gpt2-124m --global-batch 4 --seq 128 --threads 1 --steps 4 --warmup 1 --json "$@")
for r in $(seq "$rounds"); do
    a=$("${mpirun[@]}" "$old" bench parallel "${args[@]}")
    b=$("${mpirun[@]}" "$new" bench parallel "${args[@]}")
    echo "$a"
    echo "$b"
    python3 -c '
import json, sys
a, b = json.loads(sys.argv[1]), json.loads(sys.argv[2])
peak = lambda j: max(r["peak_bytes"]["total"] for r in j["per_rank"]) / 2**30
print(json.dumps({"round": int(sys.argv[3]), "old_step_s": a["step_time_s"],
                  "new_step_s": b["step_time_s"],
                  "new_over_old": b["step_time_s"] / a["step_time_s"],
                  "old_peak_gib": round(peak(a), 3), "new_peak_gib": round(peak(b), 3)}))
' "$a" "$b" "$r"
done
