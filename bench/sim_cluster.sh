#!/usr/bin/env bash
# The cluster simulator's benchmark (BENCHMARKS.md, "Cluster simulation"):
#  1. speed: a 100,000-job synthetic trace on 10,000 H100s under five
#     policies with failures, spot capacity and a carbon profile; wall time
#     of the whole command (median of REPS runs) and events per second;
#  2. outcomes: each policy's waits, utilisation, cost and CO2 on one
#     representative trace (the same trace), and its pictures;
#  3. replays of the public SWF logs in $TRACES (default ../shared/traces):
#     on ALCF Theta 2023, the second half's mean and p90 wait, simulated over
#     recorded, and the job-by-job Spearman correlation of waits (the first
#     half warms the queue up) for FIFO, EASY, multifactor and WFP, then
#     `apiary sim fit` (settings chosen on the first half alone and carried to
#     the second), without and with --infer-users 10;
#  4. time per policy (fifo, backfill, multifactor, backfill with 50
#     reservations) on a 100,000-job synthetic log.
#   bench/sim_cluster.sh [build dir] [out dir]
# ONLY=replay runs parts 3 and 4 alone.
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

TRACES=${TRACES:-../shared/traces}
echo "== machine: $(lscpu | sed -n 's/^Model name: *//p'), load $(cut -d' ' -f1 /proc/loadavg)"

replay_part() {
theta="$TRACES/theta_2023.swf.gz"
echo "== replay: $theta, waits of the second half (first half: warm-up)"
python3 - "$apiary" "$theta" "$out" <<'PY'
import json, subprocess, sys, time
apiary, full, out = sys.argv[1:4]
def run(policy, extra=()):
    cmd = [apiary, "sim", "cluster", "--trace", full, "--policies", policy,
           "--warmup-fraction", "0.5", "--json", *extra]
    j = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    r = j["replay"][policy]
    return {"mean": r["mean_wait_s"] / r["recorded_mean_wait_s"],
            "p90": r["p90_wait_s"] / r["recorded_p90_wait_s"], "rho": r["spearman_wait"],
            "n": r["waits_compared"], "rec_mean_h": r["recorded_mean_wait_s"] / 3600,
            "rec_p90_h": r["recorded_p90_wait_s"] / 3600}
def ok(mean, p90, rho):
    return "yes" if abs(mean - 1) <= 0.25 and abs(p90 - 1) <= 0.25 and rho >= 0.5 else "no"
def row(name, m):
    print(f"| {name} | {m['mean']:.2f} | {m['p90']:.2f} | {m['rho']:.3f} | {ok(m['mean'], m['p90'], m['rho'])} |")
base = run("fifo")
print(f"second half: {base['n']} jobs with recorded waits; recorded mean {base['rec_mean_h']:.1f} h, "
      f"p90 {base['rec_p90_h']:.1f} h")
print("| setting | mean wait sim/rec | p90 wait sim/rec | Spearman | all three targets |")
print("|---|---|---|---|---|")
row("fifo", base)
row("backfill (EASY)", run("backfill"))
row("multifactor (age, size, fair share 1000 each; EASY)", run("multifactor"))
row("wfp (Cobalt's utility; EASY)", run("wfp"))
# apiary sim fit: settings searched on the first half alone, carried to the second.
def h(s): return f"{s / 3600:.1f} h"
for extra in ((), ("--infer-users", "10")):
    cmd = [apiary, "sim", "fit", "--trace", full, "--json", *extra]
    t = time.time()
    j = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    f = j["fit"]
    tried = sorted(f["tried"], key=lambda x: x["score"])
    print(f"\n`apiary sim fit --trace theta_2023.swf.gz {' '.join(extra)}`: {len(tried)} settings, "
          f"search {f['search_s']:.0f} s, whole command {time.time() - t:.0f} s")
    for x in tried[:3]:
        w = x["waits"]
        print(f"  first half (score {x['score']:.3f}): mean {w['mean_wait_s'] / w['recorded_mean_wait_s']:.2f}, "
              f"p90 {w['p90_wait_s'] / w['recorded_p90_wait_s']:.2f}, Spearman {w['spearman_wait']:.3f}: {x['setting']}")
    print(f"chosen: {f['chosen']}")
    print("| jobs submitted in the second half | jobs | mean sim / rec | ratio | p50 sim / rec | p90 sim / rec | ratio | Spearman |")
    print("|---|---|---|---|---|---|---|---|")
    for w in j["rest"]:
        g = w["group"]
        rm, rp = w["recorded_mean_wait_s"], w["recorded_p90_wait_s"]
        print(f"| {g} | {w['jobs']} | {h(w['mean_wait_s'])} / {h(rm)} | {w['mean_wait_s'] / rm if rm else 0:.2f} | "
              f"{h(w['p50_wait_s'])} / {h(w['recorded_p50_wait_s'])} | {h(w['p90_wait_s'])} / {h(rp)} | "
              f"{w['p90_wait_s'] / rp if rp else 0:.2f} | {w['spearman_wait']:.3f} |")
PY
nasa="$TRACES/NASA-iPSC-1993-3.1-cln.swf.gz"
echo "== $nasa (no recorded waits: simulated only)"
"$apiary" sim cluster --trace "$nasa" --policies fifo,backfill,multifactor | sed -n '/^note\|^policy/,$p' | grep -v "^$"

echo "== time per policy: 100,000 synthetic jobs on 10,000 devices (simulation alone, median of $REPS)"
"$apiary" sim trace --jobs 100000 --gpus 10000xH100-SXM --load 0.9 --accounts 8 --seed 1 \
    --out "$out/trace100k.csv" >/dev/null 2>&1
for i in $(seq "$REPS"); do
    "$apiary" sim cluster --trace "$out/trace100k.csv" --gpus 10000xH100-SXM \
        --policies fifo,backfill,multifactor --json >"$out/t$i.json"
    "$apiary" sim cluster --trace "$out/trace100k.csv" --gpus 10000xH100-SXM \
        --policies backfill,multifactor --bf-max-job-test 50 --json >"$out/d$i.json"
done
python3 - "$out" "$REPS" <<'PY'
import json, statistics, sys
out, reps = sys.argv[1], int(sys.argv[2])
rows = {}
for i in range(1, reps + 1):
    for f, suffix in (("t", ""), ("d", " --bf-max-job-test 50")):
        for p in json.load(open(f"{out}/{f}{i}.json"))["policies"]:
            rows.setdefault(p["policy"] + suffix, []).append((p["wall_s"], p["events"], p["mean_wait_s"]))
print("| policy | events | simulation wall s (median) | min | max | mean wait |")
print("|---|---|---|---|---|---|")
for name, v in rows.items():
    w = [x[0] for x in v]
    print(f"| {name} | {v[0][1]} | {statistics.median(w):.2f} | {min(w):.2f} | {max(w):.2f} | {v[0][2] / 60:.1f} min |")
PY
}
if [ "${ONLY:-}" = replay ]; then
    replay_part
    echo "results in $out"
    exit 0
fi

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
replay_part
echo "results in $out"
