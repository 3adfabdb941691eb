#!/usr/bin/env bash
# OpenMPI's launcher of remote daemons on the test cluster (cluster.sh), in
# place of ssh: `mpirun --mca plm_rsh_agent rsh-agent.sh` calls
#   rsh-agent.sh [OPTIONS] HOST WORD...
# and this runs the words, joined as ssh joins them, with /bin/sh inside
# HOST's network and UTS namespaces. The environment passes through as it
# is (mpirun's own), so APIARY_CLUSTER_ID / APIARY_CLUSTER_DIR name the
# cluster, as they did for cluster.sh.
#
# Like an ssh client, this process stays on the launching host while the
# command runs on HOST, and ends with it. When the command dies because
# HOST crashed (`cluster.sh crash`: its link is down), an ssh client would
# hear nothing over the dead link; so this one waits, silent, until the
# link is up again, then fails as ssh does when its connection is reset.
# A host whose link is down when the command starts is waited for, as ssh
# waits to connect, for at most about two minutes.
set -euo pipefail
while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done  # ssh-style options
[ $# -ge 2 ] || { echo "rsh-agent.sh: usage: rsh-agent.sh HOST COMMAND..." >&2; exit 255; }
cluster="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/cluster.sh"
host=$1
shift
# A host whose link is down cannot be reached: ssh would wait in connect()
# until TCP gives up (about two minutes), then fail; so does this.
for _ in $(seq 127); do
    [ "$("$cluster" _link "$host" 2>/dev/null || echo up)" = down ] || break
    sleep 1
done
if [ "$("$cluster" _link "$host" 2>/dev/null || echo up)" = down ]; then
    echo "rsh-agent.sh: connect to host $host port 22: Connection timed out" >&2
    exit 255
fi
rc=0
# A host's crash kills the command; bash's report of that ("Killed") goes
# to /dev/null, as ssh says nothing, while the command's stderr is kept.
{ "$cluster" exec "$host" /bin/sh -c "$*" 2>&3 3>&- || rc=$?; } 3>&2 2>/dev/null
if [ "$("$cluster" _link "$host" 2>/dev/null || echo up)" = down ]; then
    while [ "$("$cluster" _link "$host" 2>/dev/null || echo up)" = down ]; do sleep 1; done
    echo "rsh-agent.sh: connection to $host reset" >&2
    exit 255
fi
exit $rc
