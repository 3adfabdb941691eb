#!/usr/bin/env bash
# OpenMPI's launcher of remote daemons on the test cluster (cluster.sh), in
# place of ssh: `mpirun --mca plm_rsh_agent rsh-agent.sh` calls
#   rsh-agent.sh [OPTIONS] HOST WORD...
# and this runs the words, joined as ssh joins them, with /bin/sh inside
# HOST's network and UTS namespaces. The environment passes through as it
# is (mpirun's own), so APIARY_CLUSTER_ID / APIARY_CLUSTER_DIR name the
# cluster, as they did for cluster.sh.
set -euo pipefail
while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done  # ssh-style options
[ $# -ge 2 ] || { echo "rsh-agent.sh: usage: rsh-agent.sh HOST COMMAND..." >&2; exit 255; }
host=$1
shift
exec "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/cluster.sh" exec "$host" /bin/sh -c "$*"
