#!/usr/bin/env bash
# The GPU backend's proof on a lent H100/H200 (16 cores, no network), in one
# call of the device tool, well under its 10-minute limit:
#
#   1. env      nvidia-smi, nvcc, cmake, torch: what the machine is
#   2. build    configure + build only the GPU targets with all cores, or,
#               where the image lacks apiary's build dependencies, use the
#               binaries scripts/device-bundle.sh put in .device/ (carry it)
#   3. kernels  every CUDA kernel against the CPU kernel on odd shapes,
#               forward and backward, fp32 and bf16 (test_cuda_kernels)
#   4. bench    cuBLASLt bf16 / tf32 / fp32 GEMM rates on random data (the
#               peak MFU is reported against) and attention at GPT-2 shapes
#   5. train    GPT-2 124M and tiny-llama, train.device = cuda against cpu:
#               loss curves (needs the apiary binary; records the refusal
#               while the trainer's GPU step is not wired)
#   6. torch    PyTorch eager GPT-2 124M bf16 step on the same GPU, and its
#               MFU against the bf16 peak of stage 4
#
# Everything lands in $OUT (the device tool brings back at most 8 files):
# summary.txt (stage results and the numbers; printed last), env.txt,
# build.log, kernels.log, bench.jsonl, train.log, torch.log.
# Each stage has its own time limit, cut to what is left of DEADLINE_S
# (default 540 s) so the whole run ends inside the call. A failed stage is
# recorded and the next runs; the exit code is 1 if any stage failed.
#
#   device tool: command "scripts/device-check.sh", carry [".device"] if bundled,
#   timeout_s 600.  Locally: OUT=/tmp/dc scripts/device-check.sh (stages
#   that need a GPU then fail fast and say why).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/device-check-out}"
mkdir -p "$OUT"
DEADLINE_S="${DEADLINE_S:-540}"
JOBS="${JOBS:-$(nproc)}"
BUILD="${BUILD:-build-device}"
START=$(date +%s)
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
failed=()

log() { echo "[$(date -u +%H:%M:%S) +$(($(date +%s) - START))s] $*" | tee -a "$SUMMARY"; }
left() { echo $((DEADLINE_S - ($(date +%s) - START))); }

# stage NAME LIMIT_S LOGFILE CMD...: runs CMD with a timeout of
# min(LIMIT_S, time left - 10), appending to LOGFILE.
stage() {
    local name="$1" limit="$2" logfile="$3"
    shift 3
    local budget
    budget=$(left)
    budget=$((budget - 10))
    [ "$budget" -lt "$limit" ] && limit=$budget
    if [ "$limit" -le 5 ]; then
        log "$name: SKIPPED (no time left of DEADLINE_S=$DEADLINE_S)"
        failed+=("$name")
        return 1
    fi
    log "$name: start (limit ${limit}s)"
    local t0 rc=0
    t0=$(date +%s)
    if declare -F "$1" >/dev/null; then
        # A function of this script: timeout runs programs, so a bash that
        # defines it runs it (the variables it reads are exported).
        timeout --kill-after=5 "$limit" bash -c "$(declare -f "$1"); \"\$@\"" _ "$@" \
            >> "$logfile" 2>&1 || rc=$?
    else
        timeout --kill-after=5 "$limit" "$@" >> "$logfile" 2>&1 || rc=$?
    fi
    if [ "$rc" -eq 0 ]; then
        log "$name: ok ($(($(date +%s) - t0))s)"
    else
        [ "$rc" -eq 124 ] && log "$name: TIMED OUT after ${limit}s" || log "$name: FAILED rc=$rc"
        tail -n 15 "$logfile" | sed 's/^/    | /' | tee -a "$SUMMARY"
        failed+=("$name")
    fi
    return "$rc"
}

# ---- 1. env ----
{
    date -u
    nvidia-smi || echo "nvidia-smi: not available"
    nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv || true
    command -v nvcc && nvcc --version
    cmake --version | head -n 1 || true
    ninja --version || true
    python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available())' || true
    lscpu | grep -E 'Model name|^CPU\(s\)' || true
    git log --oneline -n 1 2>/dev/null || true
} > "$OUT/env.txt" 2>&1
GPU_NAME="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)"
log "env: GPU '${GPU_NAME:-none}', $(nproc) cores"

# ---- 2. build (or the carried bundle) ----
BIN=""
APIARY=""
# NCCL from pip's nvidia-nccl wheel where the toolkit has none.
nccl_root="$(python3 -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__) if hasattr(nvidia.nccl, "__file__") and nvidia.nccl.__file__ else list(nvidia.nccl.__path__)[0])' 2>/dev/null || true)"
export BUILD JOBS nccl_root
configure() {
    cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DAPIARY_CUDA=ON \
        -DAPIARY_BUILD_BENCH=OFF ${nccl_root:+-DAPIARY_NCCL_ROOT=$nccl_root}
}
build() { cmake --build "$BUILD" --parallel "$JOBS" --target test_cuda_kernels apiary_cuda_bench apiary; }
if [ "${USE_BUNDLE:-0}" != 1 ] && stage configure 60 "$OUT/build.log" configure &&
    stage build 300 "$OUT/build.log" build; then
    BIN="$BUILD/tests/device"
    APIARY="$BUILD/apiary"
elif [ -x .device/bin/test_cuda_kernels ]; then
    log "build: using the carried bundle .device/ (scripts/device-bundle.sh)"
    BIN=.device/bin
    export LD_LIBRARY_PATH="$PWD/.device/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
# The CUDA libraries the binaries link (cuBLASLt, cudart): the toolkit's, or
# the pip wheels' that PyTorch uses.
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib \
    $(python3 -c 'import nvidia, os; [print(os.path.join(p, s, "lib")) for p in nvidia.__path__ for s in ("cublas", "cuda_runtime", "nccl")]' 2>/dev/null); do
    [ -d "$d" ] && LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
done
export LD_LIBRARY_PATH
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH" >> "$OUT/env.txt"

# ---- 3. kernels ----
if [ -n "$BIN" ]; then
    stage kernels 120 "$OUT/kernels.log" "$BIN/test_cuda_kernels" --gtest_color=no
    grep -E '^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ test' "$OUT/kernels.log" | tee -a "$SUMMARY"
    # Skipped is what a machine without a GPU gives: not a pass here.
    if ! grep -qE '^\[  PASSED  \] [1-9]' "$OUT/kernels.log" ||
        grep -qE '^\[  SKIPPED \] [1-9]' "$OUT/kernels.log"; then
        log "kernels: NOT PROVEN (tests skipped: no GPU seen)"
        failed+=(kernels-skipped)
    fi
else
    log "kernels: SKIPPED (no build and no bundle)"
    failed+=(kernels)
fi

# ---- 4. bench: the measured peak ----
PEAK_TFLOPS=""
if [ -n "$BIN" ]; then
    stage bench 120 "$OUT/bench.jsonl" "$BIN/apiary_cuda_bench" 8192 10
    PEAK_TFLOPS="$(grep '"gemm_bf16"' "$OUT/bench.jsonl" | sed 's/.*"tflops": \([0-9.]*\).*/\1/')"
    log "bench: cuBLASLt bf16 peak ${PEAK_TFLOPS:-?} TFLOP/s (8192^3, random data)"
    grep '"bench"' "$OUT/bench.jsonl" | tee -a "$SUMMARY"
fi

# ---- 5. train: loss curves, cuda against cpu ----
train_pair() {  # preset steps extra...
    local preset="$1" steps="$2"
    shift 2
    local common=(--set model.preset="$preset" --set train.steps="$steps" --set train.log_every=1
        --set train.eval_every=0 --set train.ckpt_every=0 --set train.precision=bf16 "$@")
    echo "== $preset: cuda"
    if ! "$APIARY" train --overwrite --set run.dir="runs/dc-$preset-cuda" --set train.device=cuda \
        "${common[@]}"; then
        echo "== $preset: train.device = cuda refused or failed (above); no comparison"
        return 3
    fi
    echo "== $preset: cpu"
    "$APIARY" train --overwrite --set run.dir="runs/dc-$preset-cpu" --set train.device=cpu \
        "${common[@]}" || return 1
    python3 - "runs/dc-$preset-cpu/metrics.jsonl" "runs/dc-$preset-cuda/metrics.jsonl" <<'PY'
import json, sys
def losses(p):
    return [r["loss"] for r in map(json.loads, open(p)) if "loss" in r and "step" in r]
cpu, gpu = losses(sys.argv[1]), losses(sys.argv[2])
n = min(len(cpu), len(gpu))
worst = max(abs(a - b) / abs(a) for a, b in zip(cpu[:n], gpu[:n]))
print(f"steps {n}: first {cpu[0]:.4f} / {gpu[0]:.4f}, last {cpu[n-1]:.4f} / {gpu[n-1]:.4f}, "
      f"worst relative difference {worst:.2e} (bf16 tolerance 2e-2)")
sys.exit(0 if n > 0 and worst < 2e-2 else 1)
PY
}
export APIARY
if [ -n "$APIARY" ] && [ -x "$APIARY" ]; then
    stage train-gpt2 200 "$OUT/train.log" train_pair gpt2-124m 50 --set train.batch_size=4 \
        --set train.seq_len=256
    stage train-llama 100 "$OUT/train.log" train_pair tiny-llama 50 --set train.batch_size=8 \
        --set train.seq_len=128
    grep -E '^(steps|== )' "$OUT/train.log" | tee -a "$SUMMARY"
else
    log "train: SKIPPED (no apiary binary: the bundle carries the GPU check binaries only)"
fi

# ---- 6. torch peer ----
if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    stage torch 150 "$OUT/torch.log" env PYTHONUNBUFFERED=1 python3 tools/ref/bench_torch.py \
        --device cuda --preset gpt2-124m --batch 8 --seq 1024 --precision bf16 --steps 10 \
        --warmup 3
    python3 - "$OUT/torch.log" "${PEAK_TFLOPS:-0}" <<'PY' | tee -a "$SUMMARY"
import json, sys
r = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")][-1]
peak = float(sys.argv[2]) * 1e12
L, C, T, V = 12, 768, r["seq"], 50257
# 6 N per token for the weights (N without the position table) + attention's
# 6 L T C per token (causal: half of 12 L T C).
n = r["params"] - 1024 * C
flops_per_token = 6 * n + 6 * L * T * C
mfu = r["tokens_per_s"] * flops_per_token / peak if peak > 0 else float("nan")
print(f"torch eager {r['gpu']}: {r['tokens_per_s']:.0f} tokens/s, step {r['step_time_s']*1e3:.1f} ms, "
      f"MFU {mfu:.1%} of the measured bf16 peak ({sys.argv[2]} TFLOP/s)")
PY
else
    log "torch: SKIPPED (no PyTorch with CUDA)"
fi

log "done in $(($(date +%s) - START))s; failed stages: ${failed[*]:-none}"
[ ${#failed[@]} -eq 0 ]
