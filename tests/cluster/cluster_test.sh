#!/usr/bin/env bash
# The test cluster itself (cluster.sh): hosts with their own hostnames and
# addresses that reach each other and nothing else, `up` twice keeping
# them, link settings landing in tc (and a refused one leaving the old),
# a broken host rebuilt, MPI placing ranks on both hosts through the rsh
# agent, bad input refused by name, and `down` removing everything of its
# prefix even with the state directory gone.
#   cluster_test.sh
set -eu  # no pipefail: `cmd | grep -q` may end cmd with SIGPIPE
if [ "$(id -u)" -ne 0 ]; then
    echo "cluster_test: skipped: needs root (network namespaces, veths, a bridge)"
    exit 77
fi
here=$(cd "$(dirname "$0")" && pwd)
cluster="$here/cluster.sh"
APIARY_CLUSTER_ID="c$(printf '%x' $(($$ & 0xfffff)))"
export APIARY_CLUSTER_ID
export APIARY_CLUSTER_DIR
APIARY_CLUSTER_DIR=$(mktemp -d /tmp/apiary-cluster-test.XXXXXX)
prefix="apy-$APIARY_CLUSTER_ID-"
trap 'bash "$cluster" down >/dev/null 2>&1 || true; rm -rf "$APIARY_CLUSTER_DIR"' EXIT

fail() {
    echo "cluster_test: FAILED: $*" >&2
    exit 1
}
ours() { { ip -o link show; ip netns list; } | grep -c -- "$prefix" || true; }

bash "$cluster" up 2
[ "$(bash "$cluster" exec h1 hostname)" = h1 ] || fail "h1's hostname"
[ "$(bash "$cluster" exec h2 hostname)" = h2 ] || fail "h2's hostname"
[ "$(hostname)" != h1 ] || fail "the machine's own hostname changed"
bash "$cluster" exec h2 ip -4 -o addr show | grep -q "inet 10.213.0.2/24" || fail "h2's address"
# Only the subnet's route: no default route, nowhere else to go.
routes=$(bash "$cluster" exec h2 ip -4 route show)
[ "$routes" = "$(echo "$routes" | grep '^10.213.0.0/24 ')" ] || fail "h2 has other routes: $routes"
# h1 reaches h2 (a TCP connection through bash's /dev/tcp to a listener).
bash "$cluster" exec h2 python3 -c '
import socket; s = socket.socket(); s.bind(("10.213.0.2", 7777)); s.listen(1)
c, _ = s.accept(); c.sendall(b"from-h2")' &
listener=$!
for _ in $(seq 50); do
    got=$(bash "$cluster" exec h1 bash -c 'exec 3<>/dev/tcp/10.213.0.2/7777 && cat <&3' 2>/dev/null) &&
        break
    sleep 0.1
done
wait $listener
[ "$got" = from-h2 ] || fail "h1 could not reach h2 ($got)"
# Nothing of this machine got an address on the subnet.
! ip -4 -o addr show | grep -q "10\.213\.0\." || fail "an address of the subnet outside the hosts"

# up again: the same holders, and hosts past N go.
before=$(bash "$cluster" status)
bash "$cluster" up 2
[ "$(bash "$cluster" status)" = "$before" ] || fail "up twice changed the cluster"

# Link settings reach tc on both ends; a refused one leaves the old.
bash "$cluster" link h2 rate 100mbit
tc class show dev "${prefix}v2" | grep -q "rate 100Mbit" || fail "rate on the bridge's end"
bash "$cluster" exec h2 tc class show dev "${prefix}e2" | grep -q "rate 100Mbit" ||
    fail "rate on the host's end"
bash "$cluster" link h2 loss 2%
tc filter show dev "${prefix}v2" | grep -q "bpf" || fail "no loss filter"
if bash "$cluster" link h2 rate fast 2>"$APIARY_CLUSTER_DIR/err"; then fail "rate 'fast' accepted"; fi
grep -q "rate 'fast'" "$APIARY_CLUSTER_DIR/err" || fail "the refusal does not name the rate"
bash "$cluster" status | grep -q "^h2 .*rate 100mbit .*loss 2%" || fail "settings lost: $(bash "$cluster" status)"
bash "$cluster" link h2 down
ip link show "${prefix}v2" | grep -q "state DOWN" || fail "link down"
bash "$cluster" link all reset
bash "$cluster" status | grep -q "^h2 .*link up rate 1gbit .*loss 0%" || fail "reset"
! tc filter show dev "${prefix}v2" | grep -q bpf || fail "the loss filter stayed"

# A CPU cap: the host's processes, and those started in it later, share
# P% of one core (a cgroup of ours, or the duty cycle where none is
# writable); off removes it, and the cgroup with it.
bash "$cluster" exec h2 sleep 600 &
capped=$!
for _ in $(seq 100); do
    [ "$(ip netns pids "${prefix}h2" | wc -l)" -ge 2 ] && break
    sleep 0.05
done
bash "$cluster" cpu h2 20% >"$APIARY_CLUSTER_DIR/cpu.out" 2>&1 || fail "cpu h2 20%: $(cat "$APIARY_CLUSTER_DIR/cpu.out")"
bash "$cluster" status | grep -q "^h2 .*CPU capped" || fail "status does not show the cap"
if grep -q "cgroup" "$APIARY_CLUSTER_DIR/cpu.out"; then
    cg=$(sed -n 's/.*(cgroup v[12] \(.*\))$/\1/p' "$APIARY_CLUSTER_DIR/cpu.out")
    [ -d "$cg" ] || fail "no cgroup $cg"
    grep -qx "$capped" "$cg/cgroup.procs" || fail "the running process is not in $cg"
    later=$(bash "$cluster" exec h2 sh -c 'echo $$')
    [ -n "$later" ] || fail "exec in a capped host"
    bash "$cluster" exec h2 sh -c 'cat /proc/self/cgroup' | grep -q "${prefix}h2" ||
        fail "a command started in h2 is not in its cgroup"
    bash "$cluster" cpu h2 off
    [ ! -d "$cg" ] || fail "cpu off left $cg"
else
    grep -q "SIGSTOP/SIGCONT" "$APIARY_CLUSTER_DIR/cpu.out" || fail "cpu: $(cat "$APIARY_CLUSTER_DIR/cpu.out")"
    bash "$cluster" cpu h2 off
fi
bash "$cluster" status | grep -q "CPU capped" && fail "the cap stayed after off"
# The fallback, forced: the process is stopped part of each 100 ms, and
# running again after off.
APIARY_CLUSTER_CPU=duty bash "$cluster" cpu h2 10% >"$APIARY_CLUSTER_DIR/cpu.out" 2>&1
grep -q "SIGSTOP/SIGCONT" "$APIARY_CLUSTER_DIR/cpu.out" || fail "duty: $(cat "$APIARY_CLUSTER_DIR/cpu.out")"
stopped=no
for _ in $(seq 200); do
    [ "$(awk '{print $3}' "/proc/$capped/stat")" = T ] && stopped=yes && break
    sleep 0.01
done
[ $stopped = yes ] || fail "the duty cycle never stopped the host's process"
bash "$cluster" cpu h2 off
sleep 0.3
[ "$(awk '{print $3}' "/proc/$capped/stat")" != T ] || fail "the process stayed stopped after off"
for args in "cpu h2 fast" "cpu h2 0%" "cpu h2"; do
    # shellcheck disable=SC2086
    if bash "$cluster" $args 2>/dev/null; then fail "'$args' accepted"; fi
done
kill "$capped" 2>/dev/null || true
wait "$capped" 2>/dev/null || true

# A host whose holder died is rebuilt by up.
holder=$(sed -n 's/^pid=//p' "$APIARY_CLUSTER_DIR/hosts/2")
kill -9 "$holder"
bash "$cluster" status | grep -q "^h2 .*BROKEN" || fail "status missed the dead holder"
bash "$cluster" up 2
[ "$(bash "$cluster" exec h2 hostname)" = h2 ] || fail "h2 not rebuilt"

# MPI over both hosts through the rsh agent.
if command -v mpirun >/dev/null; then
    hosts=$(bash "$cluster" mpirun -n 4 hostname | sort | tr '\n' ' ')
    [ "$hosts" = "h1 h1 h2 h2 " ] || fail "mpirun placed ranks on: $hosts"
fi

# Bad input.
for args in "exec h9 true" "link h1 colour red" "up 0" "crash"; do
    # shellcheck disable=SC2086
    if bash "$cluster" $args 2>/dev/null; then fail "'$args' accepted"; fi
done
if APIARY_CLUSTER_ID=Bad_Id bash "$cluster" status 2>/dev/null; then fail "a bad id accepted"; fi

# down, with the state directory gone, by prefix.
bash "$cluster" exec h2 sleep 600 &
sleeper=$!
for _ in $(seq 100); do
    [ "$(ip netns pids "${prefix}h2" | wc -l)" -ge 2 ] && break
    sleep 0.05
done
rm -rf "$APIARY_CLUSTER_DIR"
bash "$cluster" down
wait $sleeper 2>/dev/null || true
[ "$(ours)" -eq 0 ] || fail "left behind: $({ ip -o link show; ip netns list; } | grep -- "$prefix")"
bash "$cluster" down  # twice is fine
echo "cluster_test: passed"
