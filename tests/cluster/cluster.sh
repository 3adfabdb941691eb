#!/usr/bin/env bash
# A test cluster of N hosts on this machine: each host is a network
# namespace plus its own UTS namespace (its own hostname, so MPI and Slurm
# see separate nodes), joined to a bridge this script creates by one veth
# pair, with one address on the bridge's subnet and no route anywhere else
# (no default route, no address on the bridge, no NAT). Each host's link is
# shaped by tc in both directions: an htb class for the rate, netem under it
# for the latency (on what the host sends; only where the kernel has netem)
# and a classic-BPF filter for loss (both ways). The file system and the
# process table stay shared: a host is a view of the network, not a VM.
#
#   cluster.sh up N               create hosts h1..hN (idempotent: a healthy
#                                 host is kept with its link settings, a
#                                 broken one rebuilt, hosts past N removed)
#   cluster.sh down               remove everything of this cluster, found by
#                                 its prefix even when the state is lost
#   cluster.sh exec HOST CMD...   run CMD inside HOST's namespaces
#   cluster.sh link HOST rate R | delay D | loss P | down | up | reset
#                                 R as tc writes rates (1gbit, 100mbit),
#                                 D as times (100us, 5ms; needs netem), P a
#                                 percentage (2%);
#                                 HOST may be `all`
#   cluster.sh crash HOST         the host dies: its link goes down and every
#                                 process in it is SIGKILLed (the namespaces
#                                 stay; `link HOST up` brings it back, empty)
#   cluster.sh cpu HOST P% | off  cap the CPU time of every process in HOST
#                                 (now and started later through `exec`) at
#                                 P% of one core: a cgroup of ours
#                                 (cgroup v2 cpu.max, or v1 cpu.cfs_quota_us);
#                                 without a writable cpu controller a
#                                 SIGSTOP/SIGCONT duty cycle of the host's
#                                 processes, said on stderr. `off` removes it
#   cluster.sh mpirun ARGS...     mpirun on h1 over every host (see below)
#   cluster.sh hostfile           print the path of the MPI hostfile
#   cluster.sh status             hosts, addresses, links, what runs in them
#
# HOST is h<i>, i, the host's address or its namespace name.
#
# Settings (environment):
#   APIARY_CLUSTER_ID      names everything: interfaces and namespaces are
#                          apy-<ID>-*; 1-6 of [a-z0-9] [0]
#   APIARY_CLUSTER_DIR     state (pids, host files, hostfile)
#                          [/tmp/apiary-cluster-<ID>]
#   APIARY_CLUSTER_SUBNET  the first three octets of the hosts' /24; host i
#                          gets .i [10.213.0]. Refused when an interface of
#                          this machine has an address in it. Two clusters
#                          may use the same subnet: each has its own bridge.
#   APIARY_CLUSTER_SLOTS   MPI slots per host in the hostfile [2]
#   APIARY_CLUSTER_CPU     `duty`: `cpu` caps by the SIGSTOP/SIGCONT duty
#                          cycle even where a cgroup cpu controller is
#                          writable (to test the fallback)
#
# MPI: `cluster.sh mpirun -n 4 prog` runs OpenMPI's mpirun inside h1 with
# the hostfile, rsh-agent.sh as the launcher of the other hosts' daemons, the
# TCP BTL and the runtime's own traffic restricted to the cluster's subnet,
# and shared memory (vader) between ranks of one host.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
id=${APIARY_CLUSTER_ID:-0}
if ! [[ $id =~ ^[a-z0-9]{1,6}$ ]]; then
    echo "cluster.sh: APIARY_CLUSTER_ID='$id': use 1 to 6 of a-z and 0-9" \
        "(interface names hold 15 characters)" >&2
    exit 2
fi
prefix="apy-$id"
state=${APIARY_CLUSTER_DIR:-/tmp/apiary-cluster-$id}
subnet=${APIARY_CLUSTER_SUBNET:-10.213.0}
slots=${APIARY_CLUSTER_SLOTS:-2}
bridge="$prefix-br"
default_rate=1gbit
default_loss=0%

die() {
    echo "cluster.sh: $*" >&2
    exit 1
}

preflight() {
    [ "$(id -u)" -eq 0 ] || die "must run as root (it creates network namespaces, veths and a bridge)"
    local t missing=()
    for t in ip tc nsenter unshare setsid; do
        command -v "$t" >/dev/null || missing+=("$t")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        die "missing tool(s): ${missing[*]} (Debian: iproute2 for ip and tc, util-linux for" \
            "nsenter, unshare and setsid)"
    fi
    [[ $subnet =~ ^[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}$ ]] ||
        die "APIARY_CLUSTER_SUBNET='$subnet': give the first three octets, e.g. 10.213.0"
}

# Host i's names.
netns_of() { echo "$prefix-h$1"; }
veth_of() { echo "$prefix-v$1"; }   # the bridge's end, in this namespace
inner_of() { echo "$prefix-e$1"; }  # the host's end, in its namespace
addr_of() { echo "$subnet.$1"; }

# The index of a host named h<i>, i, its address or its namespace.
host_index() {
    local h=$1
    case $h in
    h[0-9]*) h=${h#h} ;;
    "$subnet".*) h=${h#"$subnet".} ;;
    "$prefix"-h*) h=${h#"$prefix"-h} ;;
    esac
    [[ $h =~ ^[0-9]+$ ]] && [ -f "$state/hosts/$h" ] ||
        die "no host '$1' in cluster $id (state $state); hosts: $(list_hosts | sed 's/^/h/' | tr '\n' ' ')"
    echo "$h"
}

list_hosts() {
    [ -d "$state/hosts" ] || return 0
    find "$state/hosts" -maxdepth 1 -type f -name '[0-9]*' -printf '%f\n' | sort -n
}

# A host file holds shell assignments: pid, rate, delay, loss, link.
read_host() {
    pid='' rate=$default_rate delay=$(default_delay) loss=$default_loss link=up
    # shellcheck disable=SC1090
    [ -f "$state/hosts/$1" ] && . "$state/hosts/$1"
    return 0
}
write_host() {  # write_host I: from the variables read_host sets
    printf 'pid=%s\nrate=%s\ndelay=%s\nloss=%s\nlink=%s\n' "$pid" "$rate" "$delay" "$loss" "$link" \
        >"$state/hosts/$1.tmp"
    mv "$state/hosts/$1.tmp" "$state/hosts/$1"
}

holder_alive() {  # holder_alive PID NETNS: PID is the UTS holder inside NETNS
    local p=$1 ns=$2
    [ -n "$p" ] && [ -e "/proc/$p" ] && [ -e "/run/netns/$ns" ] &&
        [ "$(stat -L -c %i "/proc/$p/ns/net" 2>/dev/null)" = "$(stat -L -c %i "/run/netns/$ns")" ] &&
        [ "$(readlink "/proc/$p/ns/uts")" != "$(readlink /proc/self/ns/uts)" ]
}

host_healthy() {
    read_host "$1"
    holder_alive "$pid" "$(netns_of "$1")" && ip link show "$(veth_of "$1")" >/dev/null 2>&1 &&
        ip -n "$(netns_of "$1")" -4 addr show dev "$(inner_of "$1")" 2>/dev/null |
        grep -q "inet $(addr_of "$1")/24"
}

# Every process inside a namespace, the holder included, SIGKILLed.
kill_netns_pids() {  # kill_netns_pids NETNS [EXCEPT_PID]
    local ns=$1 except=${2:-} p left
    [ -e "/run/netns/$ns" ] || return 0
    for _ in 1 2 3 4 5 6 7 8 9 10; do
        left=0
        for p in $(ip netns pids "$ns" 2>/dev/null); do
            [ "$p" = "$except" ] && continue
            kill -9 "$p" 2>/dev/null || true
            left=1
        done
        [ $left -eq 0 ] && return 0
        sleep 0.1
    done
}

remove_host() {
    local i=$1 ns
    ns=$(netns_of "$i")
    cpu_off "$i"
    kill_netns_pids "$ns"
    ip link del "$(veth_of "$i")" 2>/dev/null || true
    ip link del "$prefix-y$i" 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
    rm -f "$state/hosts/$i"
}

# Whether the kernel has netem (tc's delay); probed once per cluster in a
# throw-away namespace of ours.
have_netem() {
    if [ ! -f "$state/netem" ]; then
        local probe="$prefix-probe"
        mkdir -p "$state"
        ip netns add "$probe"
        if tc -n "$probe" qdisc add dev lo root netem delay 1us 2>/dev/null; then
            echo yes >"$state/netem"
        else
            echo no >"$state/netem"
        fi
        ip netns del "$probe"
    fi
    [ "$(cat "$state/netem")" = yes ]
}

# 100 us where the kernel can delay packets, none where it cannot.
default_delay() { if have_netem; then echo 100us; else echo 0us; fi; }

# Shaping of one end of a host's link: an htb class at the rate, netem
# under it for the delay (where the kernel has netem), and for loss a
# classic-BPF filter that matches a random fraction of the packets and
# redirects them to a blackhole (an ifb whose queue holds nothing), as
# kernels without netem still have cls_bpf and mirred.
shape() {  # shape NETNS|"" DEV BLACKHOLE RATE DELAY LOSS
    local ns=$1 dev=$2 hole=$3 r=$4 d=$5 l=$6 burst nsopt=() threshold
    [ -n "$ns" ] && nsopt=(-n "$ns")
    # A burst of 1 ms at the rate, at least 128 KiB: GSO hands veth packets
    # of up to 64 KiB, and a class must pass one whole.
    burst=$(rate_bytes_per_ms "$r")
    [ "$burst" -lt 131072 ] && burst=131072
    tc "${nsopt[@]}" qdisc del dev "$dev" root 2>/dev/null || true
    tc "${nsopt[@]}" qdisc add dev "$dev" root handle 1: htb default 10
    tc "${nsopt[@]}" class add dev "$dev" parent 1: classid 1:10 htb rate "$r" ceil "$r" \
        burst "$burst" cburst "$burst" quantum 65536 ||
        die "tc refused rate '$r' on $dev (write rates as tc does: 1gbit, 100mbit)"
    if [ "${d%%[a-z]*}" != 0 ]; then
        have_netem || die "delay $d: this kernel has no netem qdisc (CONFIG_NET_SCH_NETEM);" \
            "only rate, loss, down and up are available here"
        tc "${nsopt[@]}" qdisc add dev "$dev" parent 1:10 handle 10: netem delay "$d" limit 100000 ||
            die "tc (netem) refused delay '$d' on $dev (write times as 100us, 5ms)"
    fi
    if [ "${l%\%}" != 0 ]; then
        threshold=$(awk -v p="${l%\%}" 'BEGIN { if (p !~ /^[0-9.]+$/ || p > 100) exit 1;
            printf "%.0f", (1 - p / 100) * 4294967296 }') ||
            die "loss '$l': give a percentage from 0 to 100, e.g. 2%"
        [ "$threshold" -gt 4294967295 ] && threshold=4294967295
        if ! ip "${nsopt[@]}" link show "$hole" >/dev/null 2>&1; then
            ip "${nsopt[@]}" link add "$hole" type ifb
            [ -n "$ns" ] || echo 1 >"/proc/sys/net/ipv6/conf/$hole/disable_ipv6"
            ip "${nsopt[@]}" link set "$hole" up
            tc "${nsopt[@]}" qdisc add dev "$hole" root pfifo limit 0
        fi
        # A = a random u32 (SKF_AD_RANDOM); A >= threshold: match (lost).
        tc "${nsopt[@]}" filter add dev "$dev" parent 1: prio 1 bpf \
            bytecode "4,32 0 0 4294963256,53 1 0 $threshold,6 0 0 0,6 0 0 4294967295," \
            classid 1:10 action mirred egress redirect dev "$hole" ||
            die "tc refused the loss filter on $dev (needs cls_bpf and act_mirred)"
    fi
}

rate_bytes_per_ms() {  # bytes per millisecond of a tc rate
    local r=${1,,} n unit
    n=${r%%[a-z]*}
    unit=${r#"$n"}
    case $unit in
    bit | "") echo $((n / 8000)) ;;
    kbit) echo $((n / 8)) ;;
    mbit) echo $((n * 125)) ;;
    gbit) echo $((n * 125000)) ;;
    tbit) echo $((n * 125000000)) ;;
    bps) echo $((n / 1000)) ;;
    kbps) echo $((n)) ;;
    mbps) echo $((n * 1000)) ;;
    gbps) echo $((n * 1000000)) ;;
    *) die "rate '$1': write it as tc does, e.g. 1gbit, 100mbit, 500kbit" ;;
    esac
}

apply_link() {  # apply_link I: the recorded settings onto both ends
    local i=$1
    read_host "$i"
    shape "$(netns_of "$i")" "$(inner_of "$i")" "$prefix-x$i" "$rate" "$delay" "$loss"
    shape "" "$(veth_of "$i")" "$prefix-y$i" "$rate" 0us "$loss"
    ip link set "$(veth_of "$i")" "$link"
}

add_host() {
    local i=$1 ns veth inner p
    ns=$(netns_of "$i")
    veth=$(veth_of "$i")
    inner=$(inner_of "$i")
    ip netns add "$ns"
    ip link add "$veth" type veth peer name "$inner" netns "$ns"
    # No IPv6 on anything of ours: no link-local addresses, no router
    # solicitations; the hosts speak IPv4 on their subnet only.
    echo 1 >"/proc/sys/net/ipv6/conf/$veth/disable_ipv6" 2>/dev/null || true
    ip netns exec "$ns" sh -c 'echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6;
        echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6' 2>/dev/null || true
    ip link set "$veth" master "$bridge"
    ip link set "$veth" up
    ip -n "$ns" link set lo up
    ip -n "$ns" addr add "$(addr_of "$i")/24" dev "$inner"
    ip -n "$ns" link set "$inner" up
    # The UTS holder: a sleeping process in the host's network namespace and
    # its own UTS namespace, hostname h<i>; commands enter both through it.
    rm -f "$state/hosts/$i.pid"
    setsid nsenter --net="/run/netns/$ns" unshare --uts sh -c \
        "hostname h$i && echo \$\$ > '$state/hosts/$i.pid' && exec sleep infinity" \
        </dev/null >/dev/null 2>&1 &
    for _ in $(seq 100); do [ -s "$state/hosts/$i.pid" ] && break; sleep 0.05; done
    p=$(cat "$state/hosts/$i.pid" 2>/dev/null || true)
    rm -f "$state/hosts/$i.pid"
    holder_alive "$p" "$ns" || die "host h$i: the UTS holder did not start"
    pid=$p rate=$default_rate delay=$(default_delay) loss=$default_loss link=up
    write_host "$i"
    apply_link "$i"
}

# ---- CPU caps (cluster.sh cpu) ----
# The cpu controller this machine lets us use: "v2 DIR" (a cgroup2 mount
# whose cgroup.subtree_control enables cpu: children get cpu.max), "v1 DIR"
# (the cgroup v1 cpu hierarchy: cpu.cfs_quota_us), or nothing. Only a
# cgroup of ours (apy-<ID>-h<i>) is created, directly under DIR; nothing
# else of the hierarchy is changed.
cpu_controller() {
    local d
    # (APIARY_CLUSTER_CPU=duty: the fallback even where cgroups work)
    [ "${APIARY_CLUSTER_CPU:-}" = duty ] && return 0
    for d in /sys/fs/cgroup /sys/fs/cgroup/unified; do
        if [ -f "$d/cgroup.subtree_control" ] && grep -qw cpu "$d/cgroup.subtree_control" &&
            [ -w "$d" ]; then
            echo "v2 $d"
            return 0
        fi
    done
    for d in /sys/fs/cgroup/cpu /sys/fs/cgroup/cpu,cpuacct; do
        if [ -f "$d/cpu.cfs_quota_us" ] && [ -w "$d" ]; then
            echo "v1 $d"
            return 0
        fi
    done
}

# Every process of host i (its network namespace) into the cgroup DIR.
cpu_move_all() {  # cpu_move_all I DIR
    local p
    for p in $(ip netns pids "$(netns_of "$1")" 2>/dev/null); do
        echo "$p" >"$2/cgroup.procs" 2>/dev/null || true  # (it may have ended)
    done
}

# A cgroup of ours removed: its processes back to the hierarchy's root
# first (a cgroup must be empty to go).
cgroup_remove() {  # cgroup_remove DIR ROOT
    local p
    for _ in 1 2 3 4 5 6 7 8 9 10; do
        for p in $(cat "$1/cgroup.procs" 2>/dev/null); do
            echo "$p" >"$2/cgroup.procs" 2>/dev/null || true
        done
        rmdir "$1" 2>/dev/null && return 0
        [ -d "$1" ] || return 0
        sleep 0.1
    done
    return 1
}

cpu_off() {  # cpu_off I: the cap gone, the host's processes running freely
    local i=$1 f kind cg root p
    f="$state/cpu/$i"
    [ -f "$state/cpu/$i" ] || return 0
    read -r kind cg root <"$f" || true
    if [ "$kind" = duty ]; then
        # cg is the duty cycler's pid; every stopped process continues.
        kill "$cg" 2>/dev/null || true
        for p in $(ip netns pids "$(netns_of "$i")" 2>/dev/null); do kill -CONT "$p" 2>/dev/null || true; done
    elif [ -d "$cg" ]; then
        cgroup_remove "$cg" "$root" || echo "cluster.sh: warning: could not remove cgroup $cg" >&2
    fi
    rm -f "$f"
}

cmd_cpu() {
    [ $# -eq 2 ] || die "cpu HOST P%|off: give a host and a share of one core, e.g. 20%"
    local i pct kind root cg quota
    i=$(host_index "$1")
    cpu_off "$i"
    mkdir -p "$state/cpu"
    [ "$2" = off ] && { echo "cluster $id: h$i: no CPU cap"; return 0; }
    pct=${2%\%}
    [[ $pct =~ ^[0-9]+$ ]] && [ "$pct" -ge 1 ] && [ "$pct" -le 10000 ] ||
        die "cpu $1 '$2': give a whole percentage of one core, 1% to 10000%, or off"
    quota=$((pct * 1000))  # of a 100 ms period
    read -r kind root < <(cpu_controller) || true
    if [ -n "${kind:-}" ]; then
        cg="$root/$prefix-h$i"
        mkdir -p "$cg"
        if [ "$kind" = v2 ]; then
            echo "$quota 100000" >"$cg/cpu.max"
        else
            echo 100000 >"$cg/cpu.cfs_period_us"
            echo "$quota" >"$cg/cpu.cfs_quota_us"
        fi
        echo "$kind $cg $root" >"$state/cpu/$i"
        cpu_move_all "$i" "$cg"
        echo "cluster $id: h$i capped at $pct% of one core (cgroup $kind $cg)"
        return 0
    fi
    # No cpu controller we may write: stop and continue the host's
    # processes, pct% of each 100 ms running (at most 100%).
    [ "$pct" -le 100 ] || die "cpu $1 $2: over 100% needs a cgroup cpu controller, and none is writable here"
    echo "cluster.sh: no writable cgroup cpu controller here: capping h$i by a SIGSTOP/SIGCONT" \
        "duty cycle ($pct% of each 100 ms) instead" >&2
    local ns
    ns=$(netns_of "$i")
    setsid bash -c "run=\$(awk 'BEGIN{print $pct/1000}'); stop=\$(awk 'BEGIN{print (100-$pct)/1000}');
        trap 'exit 0' TERM
        while :; do
            [ -e /run/netns/$ns ] || exit 0
            for p in \$(ip netns pids $ns); do kill -STOP \$p 2>/dev/null; done
            sleep \$stop
            for p in \$(ip netns pids $ns); do kill -CONT \$p 2>/dev/null; done
            sleep \$run
        done" </dev/null >/dev/null 2>&1 &
    echo "duty $! -" >"$state/cpu/$i"
    echo "cluster $id: h$i capped at $pct% of one core (duty cycle, pid $!)"
}

# A command about to enter host i joins its cgroup, so that what it starts
# there (an MPI daemon and its ranks) is capped too.
cpu_join() {  # cpu_join I
    local kind cg root
    [ -f "$state/cpu/$1" ] || return 0
    read -r kind cg root <"$state/cpu/$1" || true
    [ "$kind" != duty ] && [ -d "$cg" ] && echo $$ >"$cg/cgroup.procs" 2>/dev/null || true
}

write_hostfile() {
    local i
    : >"$state/hostfile.tmp"
    for i in $(list_hosts); do echo "h$i slots=$slots" >>"$state/hostfile.tmp"; done
    mv "$state/hostfile.tmp" "$state/hostfile"
}

cmd_up() {
    local n=${1:-} i
    [[ $n =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 250 ] ||
        die "up N: N hosts, 1 to 250 (got '${1:-}')"
    # The subnet must be ours alone: no interface here may have an address
    # in it (the bridge gets none; the hosts' routes stay inside them).
    if ip -4 -o addr show | awk '{print $4}' | grep -q "^${subnet//./\\.}\."; then
        die "subnet $subnet.0/24 is in use by an interface of this machine; choose another" \
            "with APIARY_CLUSTER_SUBNET"
    fi
    mkdir -p "$state/hosts"
    if ! ip link show "$bridge" >/dev/null 2>&1; then
        ip link add "$bridge" type bridge
        echo 1 >"/proc/sys/net/ipv6/conf/$bridge/disable_ipv6" 2>/dev/null || true
    fi
    ip link set "$bridge" up
    for i in $(list_hosts); do
        [ "$i" -gt "$n" ] && remove_host "$i"
    done
    for i in $(seq "$n"); do
        if [ -f "$state/hosts/$i" ] && host_healthy "$i"; then
            apply_link "$i"
            continue
        fi
        remove_host "$i"
        add_host "$i"
    done
    write_hostfile
    echo "cluster $id: $n host(s) up on $subnet.0/24 (bridge $bridge, state $state)"
}

cmd_down() {
    local i ns dev
    for i in $(list_hosts); do remove_host "$i"; done
    # Whatever a crashed run left: namespaces and links by prefix only.
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$prefix-" || true); do
        kill_netns_pids "$ns"
        ip netns del "$ns" 2>/dev/null || true
    done
    for dev in $(ip -o link show | awk -F': ' '{print $2}' | sed 's/@.*//' | grep "^$prefix-" || true); do
        ip link del "$dev" 2>/dev/null || true
    done
    # Our cgroups (cluster.sh cpu), by prefix too.
    local kind root cg
    read -r kind root < <(cpu_controller) || true
    if [ -n "${kind:-}" ]; then
        for cg in "$root/$prefix"-h*; do
            [ -d "$cg" ] || continue
            cgroup_remove "$cg" "$root" || echo "cluster.sh: warning: could not remove cgroup $cg" >&2
        done
    fi
    rm -rf "$state"
    echo "cluster $id: down"
}

cmd_exec() {
    [ $# -ge 2 ] || die "exec HOST CMD...: give a host and a command"
    local i
    i=$(host_index "$1")
    shift
    read_host "$i"
    holder_alive "$pid" "$(netns_of "$i")" || die "host h$i is not running; run 'cluster.sh up N'"
    cpu_join "$i"
    exec nsenter -t "$pid" --net --uts -- "$@"
}

cmd_link() {
    [ $# -ge 2 ] || die "link HOST rate R|delay D|loss P|down|up|reset"
    local h=$1 what=$2 val=${3:-} i hosts
    if [ "$h" = all ]; then hosts=$(list_hosts); else hosts=$(host_index "$h"); fi
    for i in $hosts; do
        read_host "$i"
        case $what in
        rate | delay | loss)
            [ -n "$val" ] || die "link $h $what: give a value"
            eval "$what=\$val"
            ;;
        down | up) link=$what ;;
        reset) rate=$default_rate delay=$(default_delay) loss=$default_loss link=up ;;
        *) die "link: unknown setting '$what'; use rate, delay, loss, down, up or reset" ;;
        esac
        # Applied from a copy: a setting tc refuses leaves the old one.
        cp "$state/hosts/$i" "$state/hosts/$i.old"
        write_host "$i"
        # (a process of its own, so that errexit holds inside it)
        if ! "$here/cluster.sh" _apply "$i"; then
            mv "$state/hosts/$i.old" "$state/hosts/$i"
            apply_link "$i"
            exit 1
        fi
        rm -f "$state/hosts/$i.old"
    done
}

cmd_crash() {
    [ $# -eq 1 ] || die "crash HOST"
    local i
    i=$(host_index "$1")
    read_host "$i"
    # The link first, so that the dying processes' sockets send nothing
    # (a host that loses power sends no FIN); then every process but the
    # holder, which keeps the hostname for a restart.
    link=down
    write_host "$i"
    ip link set "$(veth_of "$i")" down
    kill_netns_pids "$(netns_of "$i")" "$pid"
    echo "cluster $id: h$i crashed (link down, its processes killed); 'link h$i up' revives it"
}

cmd_status() {
    local i n=0 procs
    echo "cluster $id: state $state, subnet $subnet.0/24, bridge $bridge" \
        "($(ip link show "$bridge" >/dev/null 2>&1 && echo present || echo absent))"
    for i in $(list_hosts); do
        n=$((n + 1))
        read_host "$i"
        if holder_alive "$pid" "$(netns_of "$i")"; then
            procs=$(($(ip netns pids "$(netns_of "$i")" | wc -l) - 1))
            echo "h$i $(addr_of "$i") holder $pid, link $link rate $rate delay $delay" \
                "loss $loss, $procs process(es) besides the holder$(
                    [ -f "$state/cpu/$i" ] && echo ", CPU capped ($(cut -d' ' -f1-2 "$state/cpu/$i"))")"
        else
            echo "h$i $(addr_of "$i") BROKEN (holder $pid gone); 'cluster.sh up N' rebuilds it"
        fi
    done
    [ $n -gt 0 ] || echo "no hosts"
}

cmd_mpirun() {
    [ -f "$state/hostfile" ] || die "no cluster $id is up (state $state); run 'cluster.sh up N'"
    export APIARY_CLUSTER_ID=$id APIARY_CLUSTER_DIR=$state APIARY_CLUSTER_SUBNET=$subnet
    exec "$here/cluster.sh" exec h1 mpirun --allow-run-as-root --oversubscribe --bind-to none \
        --hostfile "$state/hostfile" \
        --mca plm_rsh_agent "$here/rsh-agent.sh" \
        --mca btl tcp,self,vader \
        --mca btl_tcp_if_include "$subnet.0/24" \
        --mca btl_tcp_links 2 \
        --mca oob_tcp_if_include "$subnet.0/24" \
        "$@"
}

[ $# -ge 1 ] || die "usage: cluster.sh up N | down | exec HOST CMD... | link HOST SETTING [VALUE] |" \
    "crash HOST | cpu HOST P%|off | mpirun ARGS... | hostfile | status"
verb=$1
shift
preflight
case $verb in
up) cmd_up "$@" ;;
down) cmd_down ;;
exec) cmd_exec "$@" ;;
link) cmd_link "$@" ;;
crash) cmd_crash "$@" ;;
cpu) cmd_cpu "$@" ;;
mpirun) cmd_mpirun "$@" ;;
hostfile) echo "$state/hostfile" ;;
status) cmd_status ;;
_apply) apply_link "$1" ;;
_link) read_host "$(host_index "$1")" && echo "$link" ;;
*) die "unknown command '$verb'; use up, down, exec, link, crash, cpu, mpirun, hostfile or status" ;;
esac
