#!/usr/bin/env bash
# Seven collective jobs filling a 1,024-H100 2:1 fat-tree (128 nodes of 8):
# each job alone and all together, under every placement, through the flow
# simulator; prints the per-job slowdown against the planner's formula.
# usage: bench/sim_comm_placement.sh [apiary binary]
set -euo pipefail
apiary=${1:-build/apiary}
lscpu | grep 'Model name'
/usr/bin/time -f "wall %e s, cpu %U s" "$apiary" sim comm --gpus 1024xH100-SXM \
    --set cluster.topology=fat-tree-2to1 \
    --job 256:all-reduce:1GiB:ring --job 256:all-to-all:256MiB \
    --job 128:all-reduce:1GiB:tree --job 128:all-to-all:64MiB \
    --job 128:reduce-scatter:512MiB:ring --job 64:all-gather:512MiB:ring \
    --job 64:all-to-all:64MiB --placements packed,spread,random,topology --seed 1 "$@"
