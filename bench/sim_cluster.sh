#!/usr/bin/env bash
# The cluster simulator's benchmark (BENCHMARKS.md, "Cluster simulation"):
#  1. speed: a 100,000-job synthetic trace on 10,000 H100s under five
#     policies with failures, spot capacity and a carbon profile; wall time
#     of the whole command (median of REPS runs) and events per second;
#  2. outcomes: each policy's waits, utilisation, cost and CO2 on one
#     representative trace (the same trace), and its pictures.
#   bench/sim_cluster.sh [build dir] [out dir]
set -euo pipefail
build=${1:-build}
out=${2:-$(mktemp -d /tmp/apiary-sim-bench.XXXXXX)}
REPS=${REPS:-5}
apiary="$build/apiary"
mkdir -p "$out"

# A day of grid intensity with a midday solar trough (gCO2e/kWh), and spot
# capacity that is plentiful at night and scarce in the working day, with
# its price rising as it shrinks (USD per device-hour).
{
    echo "hour,gco2_per_kwh"
    v=(420 410 400 390 380 360 300 240 180 130 100 90 90 100 130 180 250 330 400 440 450 450 440 430)
    for h in "${!v[@]}"; do echo "$h,${v[$h]}"; done
} >"$out/carbon.csv"
{
    echo "hour,spot_nodes,spot_price"
    n=(160 160 160 160 160 160 140 120 80 60 40 40 40 40 40 60 80 100 120 140 160 160 160 160)
    for h in "${!n[@]}"; do echo "$h,${n[$h]},$(awk "BEGIN{print 3.0 + (160 - ${n[$h]}) / 40}")"; done
} >"$out/spot.csv"

"$apiary" sim trace --jobs 100000 --gpus 10000xH100-SXM --load 0.9 --spot-frac 0.15 \
    --flexible-frac 0.3 --slack-h 24 --high-priority-frac 0.1 --accounts 8 --seed 1 \
    --out "$out/trace.csv"
policies=fifo,backfill,twolevel,twolevel+preempt,backfill+carbon
args=(cluster --trace "$out/trace.csv" --gpus 10000xH100-SXM --policies "$policies"
      --spot-profile "$out/spot.csv" --carbon-profile "$out/carbon.csv" --failures)

times=() cpus=()
TIMEFORMAT='%R %U %S'
for i in $(seq "$REPS"); do
    # bash's `time`: wall, user and system seconds of the whole command
    # (reading the CSV, the planner, five simulations, JSON).
    t=$( { time "$apiary" sim "${args[@]}" --json >"$out/run$i.json"; } 2>&1 )
    read -r wall user sys <<<"$t"
    times+=("$wall")
    cpus+=("$(awk "BEGIN{print $user + $sys}")")
done
echo "== speed: 100000 jobs, 10000 devices, 5 policies, $REPS runs (load: $(cut -d' ' -f1 /proc/loadavg))"
median() { sort -g | awk '{a[NR]=$1} END{printf "median %.2f s (min %.2f, max %.2f)", a[int((NR+1)/2)], a[1], a[NR]}'; }
echo "wall time: $(printf '%s\n' "${times[@]}" | median); CPU time: $(printf '%s\n' "${cpus[@]}" | median)"
python3 - "$out/run1.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
events = sum(p["events"] for p in j["policies"])
wall = sum(p["wall_s"] for p in j["policies"])
print(f"simulation alone: {events} events in {wall:.2f} s = {events / wall:.3g} events/s")
for p in j["policies"]:
    print(f"  {p['policy']:<20} {p['events']:>7} events {p['wall_s']:.3f} s "
          f"{p['events_per_s']:.3g} events/s")
PY

echo "== outcomes (the same trace)"
"$apiary" sim "${args[@]}" --jobs-out "$out/jobs.csv" --svg "$out/cluster.svg" | sed -n '/^policy/,$p'
python3 - "$out/run1.json" "$out/trace.csv" "$out/jobs.csv" <<'PY'
import csv, json, sys
j = json.load(open(sys.argv[1]))
flexible = {r["id"] for r in csv.DictReader(open(sys.argv[2])) if r["flexible"] == "1"}
flex_co2 = {}
for r in csv.DictReader(open(sys.argv[3])):
    if r["id"] in flexible:
        flex_co2[r["policy"]] = flex_co2.get(r["policy"], 0) + float(r["co2_kg"])
def dur(s):
    if s < 120: return f"{s:.0f} s"
    if s < 7200: return f"{s / 60:.1f} min"
    if s < 172800: return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} d"
print("| policy | mean wait | p95 wait | utilisation | cost (M$) | CO2e (t) | CO2e of flexible jobs (t) | restarts | lost device-h |")
print("|---|---|---|---|---|---|---|---|---|")
for p in j["policies"]:
    name = p["policy"]
    print(f"| {name} | {dur(p['mean_wait_s'])} | {dur(p['p95_wait_s'])} | "
          f"{100 * p['utilisation']:.1f}% | {p['cost_usd'] / 1e6:.2f} | {p['co2_kg'] / 1e3:.0f} | "
          f"{flex_co2.get(name, 0) / 1e3:.0f} | {p['restarts']} | {p['lost_device_hours']:.0f} |")
PY
echo "results in $out"
