#!/usr/bin/env bash
# apiary against PyTorch on the same model, batch and thread count, run
# alternately (apiary, torch, apiary, torch, ...) so that both see the same
# machine. PyTorch runs twice per round: with this machine's OPENBLAS_*
# settings as they are, and with both unset for that one command.
# usage: bench/train_vs_torch.sh [preset] [batch] [seq] [rounds]
set -euo pipefail
cd "$(dirname "$0")/.."
preset=${1:-gpt2-124m} batch=${2:-4} seq=${3:-256} rounds=${4:-2}
py=/usr/bin/python3
for r in $(seq "$rounds"); do
    ./build/apiary bench train --preset "$preset" --batch "$batch" --seq "$seq" --threads 2 --json
    $py tools/ref/bench_torch.py --preset "$preset" --batch "$batch" --seq "$seq" --threads 2
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE \
        $py tools/ref/bench_torch.py --preset "$preset" --batch "$batch" --seq "$seq" --threads 2 |
        sed 's/"peer": "pytorch \([^"]*\)"/"peer": "pytorch \1, OPENBLAS_* unset"/'
done
