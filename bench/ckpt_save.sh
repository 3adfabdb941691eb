#!/usr/bin/env bash
# Checkpoint save speed of two apiary binaries (an older commit's and this
# one) against dd, run alternately in one script so that both see the same
# disk; prints each run's JSON line and, per run, its saves' ratios to dd
# and where the median save's time went.
# usage: bench/ckpt_save.sh OLD_APIARY NEW_APIARY [rounds] [bench ckpt options...]
set -euo pipefail
old=$1 new=$2 rounds=${3:-3}
shift 3 || shift $#
args=(--preset gpt2-124m --steps 2 --batch 1 --seq 64 --reps 3 --json "$@")
echo "lscpu: $(lscpu | sed -n 's/^Model name: *//p')"
for r in $(seq "$rounds"); do
    for which in old new; do
        bin=$old
        [ "$which" = new ] && bin=$new
        load=$(cut -d' ' -f1 /proc/loadavg)
        out=$("$bin" bench ckpt "${args[@]}")
        echo "$out"
        python3 -c '
import json, sys
j = json.loads(sys.argv[1])
b = j["save_breakdown_s"]
print(json.dumps({"round": int(sys.argv[2]), "binary": sys.argv[3], "load_avg": float(sys.argv[4]),
                  "save_vs_dd_reps": [round(x, 2) for x in j["save_vs_dd_reps"]],
                  "save_vs_dd": round(j["save_vs_dd"], 2),
                  "save_gb_per_s": round(j["save_gb_per_s"], 3),
                  "dd_write_gb_per_s": round(j["dd_write_gb_per_s"], 3),
                  "save_breakdown_s": {k: round(v, 2) for k, v in b.items()}}))
' "$out" "$r" "$which" "$load"
    done
done
