#!/usr/bin/env bash
# apiary against PyTorch on the same model, batch and thread count, run
# alternately (apiary, torch, apiary, torch, ...) so that both see the same
# machine: fp32 against PyTorch fp32, and apiary's bf16 against PyTorch's
# bf16 autocast. apiary's run measures the sgemm and bf16 GEMM peaks and
# memcpy in the same process, and prints the CPU's model name.
# usage: bench/train_vs_torch.sh [preset] [batch] [seq] [rounds]
set -euo pipefail
cd "$(dirname "$0")/.."
preset=${1:-gpt2-124m} batch=${2:-4} seq=${3:-256} rounds=${4:-2}
py=/usr/bin/python3
for r in $(seq "$rounds"); do
    ./build/apiary bench train --preset "$preset" --batch "$batch" --seq "$seq" --threads 2 \
        --precision fp32,bf16 --json
    for p in fp32 bf16; do
        $py tools/ref/bench_torch.py --preset "$preset" --batch "$batch" --seq "$seq" \
            --threads 2 --precision "$p"
    done
done
