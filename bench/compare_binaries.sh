#!/usr/bin/env bash
# One step benchmark of two apiary binaries (an older commit's and this one),
# run alternately in one script so that both see the same machine; prints
# each run's JSON line and, per round, new / old tokens per second.
# usage: bench/compare_binaries.sh OLD_APIARY NEW_APIARY [rounds] [bench train options...]
set -euo pipefail
old=$1 new=$2 rounds=${3:-4}
shift 3 || shift $#
args=(--preset gpt2-124m --batch 4 --seq 256 --threads 2 --steps 5 --warmup 2 --json "$@")
for r in $(seq "$rounds"); do
    a=$("$old" bench train "${args[@]}")
    b=$("$new" bench train "${args[@]}")
    echo "$a"
    echo "$b"
    python3 -c '
import json, sys
a, b = json.loads(sys.argv[1]), json.loads(sys.argv[2])
print(json.dumps({"round": int(sys.argv[3]), "old_tokens_per_s": a["tokens_per_s"],
                  "new_tokens_per_s": b["tokens_per_s"],
                  "new_over_old": b["tokens_per_s"] / a["tokens_per_s"]}))
' "$a" "$b" "$r"
done
