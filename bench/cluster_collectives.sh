#!/usr/bin/env bash
# The network models held against a network: apiary's collectives measured
# across the hosts of tests/cluster/cluster.sh (network namespaces on this
# machine, each host's link shaped by tc), beside the time `apiary sim comm`
# (the planner's alpha-beta formulas and the flow simulator) predicts for the
# same fabric, given by its measured rate and latency:
#
#   cluster.inter_link_rate = the tc rate, cluster.inter_link_efficiency = the
#   TCP goodput of one stream over that rate (measured here, before the
#   collectives), cluster.inter_link_latency = half a TCP round trip
#   (measured), cluster.nic_shared = true (a host's ranks share its one link),
#   cluster.intra_link_rate = half this run's memcpy rate (shared memory
#   copies twice), cluster.gpus_per_node = ranks per host.
#
# Flat collectives are predicted as rings (what apiary and NCCL run for large
# messages), the hierarchical all-reduce (comm.hierarchical) as the planner's
# hierarchical algorithm. Must run as root (the cluster is namespaces).
#
# usage: bench/cluster_collectives.sh [OUTDIR]
# Environment:
#   RATES="200mbit 400mbit"  link rates, as tc writes them
#   LAYOUTS="2x2 4x1"        HOSTSxRANKS_PER_HOST
#   MIN_BYTES=1M MAX_BYTES=16M REPS=2 WARMUP=0 (each repetition runs a size
#                          enough times to move 32 MiB: at 100 Mbit/s a size
#                          takes about 10 s per repetition)
#   OPS="all_reduce reduce_scatter all_gather"
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/cluster-collectives}
A=$PWD/build/apiary
C=$PWD/tests/cluster/cluster.sh
rates=${RATES:-200mbit 400mbit}
layouts=${LAYOUTS:-2x2 4x1}
min=${MIN_BYTES:-1M} max=${MAX_BYTES:-16M} reps=${REPS:-2} warmup=${WARMUP:-0}
ops=${OPS:-all_reduce reduce_scatter all_gather}
mkdir -p "$out"
export APIARY_CLUSTER_ID=${APIARY_CLUSTER_ID:-bcoll} APIARY_CLUSTER_SUBNET=${APIARY_CLUSTER_SUBNET:-10.213.7}
trap '"$C" down >/dev/null 2>&1 || true' EXIT

# One TCP stream's goodput (bytes/s) from h1 to h2 and half its round trip
# (s), with Python's sockets: the link as the kernel sees it, before MPI.
probe=$out/probe.py
cat >"$probe" <<'EOF'
import json, socket, sys, time
role, addr = sys.argv[1], sys.argv[2]
if role == "serve":
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, 5999)); s.listen(1)
    c, _ = s.accept()
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for _ in range(200):                       # ping-pong
        c.sendall(c.recv(1))
    n, t0 = 0, None
    while True:                                # stream
        b = c.recv(1 << 20)
        if not b: break
        if t0 is None: t0 = time.time()
        n += len(b)
    c.sendall(json.dumps([n, time.time() - t0]).encode())
else:
    nbytes = int(sys.argv[3])
    c = socket.create_connection((addr, 5999))
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    rtts = []
    for _ in range(200):
        t = time.perf_counter(); c.sendall(b"x"); c.recv(1); rtts.append(time.perf_counter() - t)
    buf = b"x" * (1 << 20)
    for _ in range(nbytes >> 20): c.sendall(buf)
    c.shutdown(socket.SHUT_WR)
    n, dt = json.loads(c.recv(1000).decode())
    rtts.sort()
    print(n / dt, rtts[len(rtts) // 2] / 2)
EOF

for rate in $rates; do
    for layout in $layouts; do
        hosts=${layout%x*} per=${layout#*x}
        ranks=$((hosts * per))
        tag="$rate-$layout"
        APIARY_CLUSTER_SLOTS=$per "$C" up "$hosts" >/dev/null
        "$C" link all reset >/dev/null
        "$C" link all rate "$rate" >/dev/null
        # ~2 s of streaming at the rate.
        bytes=$(python3 -c "
r='$rate'.lower()
for u, m in (('tbit',1e12),('gbit',1e9),('mbit',1e6),('kbit',1e3),('bit',1)):
    if r.endswith(u): print(int(float(r[:-len(u)]) * m / 8 * 2)); break")
        "$C" exec h2 python3 "$probe" serve "$APIARY_CLUSTER_SUBNET.2" &
        sleep 1
        read -r goodput half_rtt < <("$C" exec h1 python3 "$probe" send "$APIARY_CLUSTER_SUBNET.2" "$bytes")
        wait
        echo "$tag: one TCP stream $goodput B/s, half round trip $half_rtt s" >&2
        for op in $ops; do
            "$C" mpirun -n "$ranks" "$A" bench comm --json --ops "$op" --min-bytes "$min" \
                --max-bytes "$max" --reps "$reps" --warmup "$warmup" >"$out/$tag-$op-flat.jsonl"
        done
        if [ "$per" -gt 1 ]; then
            "$C" mpirun -n "$ranks" "$A" bench comm --json --ops all_reduce --min-bytes "$min" \
                --max-bytes "$max" --reps "$reps" --warmup "$warmup" \
                --set comm.hierarchical=true --set comm.nodes_hint="$hosts" \
                >"$out/$tag-all_reduce-hierarchical.jsonl"
        fi
        printf '{"rate":"%s","hosts":%d,"per_host":%d,"goodput":%s,"half_rtt":%s}\n' \
            "$rate" "$hosts" "$per" "$goodput" "$half_rtt" >"$out/$tag-link.json"
    done
done
"$C" down >/dev/null

# Predictions and the table.
python3 - "$out" "$A" $rates -- $layouts <<'EOF'
import glob, json, os, subprocess, sys
out, A = sys.argv[1], sys.argv[2]
rest = sys.argv[3:]
rates, layouts = rest[:rest.index("--")], rest[rest.index("--") + 1:]
simop = {"all_reduce": "all-reduce", "reduce_scatter": "reduce-scatter", "all_gather": "all-gather"}
def rate_bps(r):
    r = r.lower()
    for u, m in (("tbit", 1e12), ("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3), ("bit", 1)):
        if r.endswith(u): return float(r[:-len(u)]) * m
print("| rate | hosts x ranks | op | algorithm | bytes | measured (apiary) | raw MPI | predicted | measured / predicted |")
print("|---|---|---|---|---|---|---|---|---|")
summary = []
for rate in rates:
    for layout in layouts:
        tag = f"{rate}-{layout}"
        link = json.load(open(f"{out}/{tag}-link.json"))
        hosts, per = link["hosts"], link["per_host"]
        eff = min(1.0, link["goodput"] * 8 / rate_bps(rate))
        for path in sorted(glob.glob(f"{out}/{tag}-*-*.jsonl")):
            op, algo = os.path.basename(path)[len(tag) + 1:-6].rsplit("-", 1)
            memcpy = None
            errs = []
            for line in open(path):
                d = json.loads(line)
                if d["op"] == "memcpy":
                    memcpy = d["gbps"]
                    continue
                sets = [f"cluster.gpus={hosts * per}", f"cluster.gpus_per_node={per}",
                        f"cluster.inter_link_rate={rate}", f"cluster.inter_link_efficiency={eff:.4f}",
                        f"cluster.inter_link_latency={link['half_rtt'] * 1e6:.1f}us",
                        "cluster.nic_shared=true", f"cluster.intra_link_rate={memcpy / 2:.3f}GB/s"]
                cmd = [A, "sim", "comm", "--json", "--placements", "packed",
                       "--job", f"{hosts * per}:{simop[op]}:{d['bytes']}:{'ring' if algo == 'flat' else algo}"]
                for s in sets: cmd += ["--set", s]
                pred = json.loads(subprocess.check_output(cmd))["results"][0]["alone_s"]
                meas, mpi = d["apiary"]["time_us"] / 1e6, d["mpi"]["time_us"] / 1e6
                ratio = meas / pred
                if d["bytes"] >= 1 << 20: errs.append(ratio)
                print(f"| {rate} | {hosts} x {per} | {op} | {algo} | {d['bytes']} | {meas * 1e3:.2f} ms | "
                      f"{mpi * 1e3:.2f} ms | {pred * 1e3:.2f} ms | {ratio:.2f} |")
            if errs:
                summary.append((rate, layout, op, algo, min(errs), max(errs)))
print()
print("| rate | hosts x ranks | op | algorithm | measured / predicted from 1 MiB up (min - max) |")
print("|---|---|---|---|---|")
for r, l, op, algo, lo, hi in summary:
    print(f"| {r} | {l} | {op} | {algo} | {lo:.2f} - {hi:.2f} |")
EOF
