#!/usr/bin/env bash
# The GPU backend's proof on a lent H100/H200 (16 cores, no network), in one
# call of the device tool, well under its 10-minute limit:
#
#   1. env      nvidia-smi, nvcc, cmake, torch: what the machine is
#   2. build    configure + build only the GPU targets with all cores, or,
#               where the image lacks apiary's build dependencies, use the
#               binaries scripts/device-bundle.sh put in .device/ (carry it)
#   3. kernels  every CUDA kernel against the CPU kernel on odd shapes,
#               forward and backward, fp32 and bf16 (test_cuda_kernels); the
#               NCCL group of one rank on this GPU (test_cuda_nccl)
#   4. bench    cuBLASLt bf16 / tf32 / fp32 GEMM rates on random data (the
#               peak MFU is reported against) and attention at GPT-2 shapes
#   5. curves   the model step through the CUDA kernels (DeviceModel, via
#               apiary_device_train) against the same step on the CPU kernels:
#               GPT-2 124M and LLaMA-60M, 50 steps from the same weights on
#               the same batches, fp32 and bf16 on the GPU
#   6. speed    GPT-2 124M bf16 on the GPU: tokens/s and MFU against the
#               bf16 peak of stage 4
#   7. trainer  `apiary train --set train.device=cuda` (refused while the
#               trainer's GPU step is not wired; needs the apiary binary)
#   8. torch    PyTorch eager GPT-2 124M bf16 step on the same GPU, and its
#               MFU against the same peak
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
    local t0 rc=0 offset
    offset=$(($(stat -c %s "$logfile" 2>/dev/null || echo 0) + 1))
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
        tail -c "+$offset" "$logfile" | tail -n 15 | sed 's/^/    | /' | tee -a "$SUMMARY"
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
build() {
    cmake --build "$BUILD" --parallel "$JOBS" --target test_cuda_kernels test_cuda_nccl \
        apiary_cuda_bench apiary_device_train apiary
}
# A carried bundle is used as it is (USE_BUNDLE=0 builds anyway): building
# here takes minutes of the lease, and the image may lack the dependencies.
# The CUDA libraries the binaries and the CUDA module link (cuBLASLt; NCCL
# for test_cuda_nccl): the toolkit's, or the pip wheels' that PyTorch uses.
[ -d .device/lib ] && LD_LIBRARY_PATH="$PWD/.device/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib \
    $(python3 -c 'import nvidia, os; [print(os.path.join(p, s, "lib")) for p in nvidia.__path__ for s in ("cublas", "cuda_runtime", "nccl")]' 2>/dev/null); do
    [ -d "$d" ] && LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
done
export LD_LIBRARY_PATH
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH" >> "$OUT/env.txt"
if [ -x .device/bin/test_cuda_kernels ] && [ "${USE_BUNDLE:-1}" != 0 ]; then
    # Built on another image: if it does not even start here (a missing
    # library, an older glibc), build instead.
    if .device/bin/test_cuda_kernels --gtest_list_tests >> "$OUT/build.log" 2>&1 &&
        .device/bin/apiary_device_train --device cpu --preset tiny --batch 1 --seq 8 --steps 1 \
            >> "$OUT/build.log" 2>&1; then
        log "build: using the carried bundle .device/ (scripts/device-bundle.sh)"
        BIN=.device/bin
    else
        log "build: the carried bundle does not run here (build.log); building instead"
    fi
fi
if [ -z "$BIN" ] && stage configure 60 "$OUT/build.log" configure &&
    stage build 300 "$OUT/build.log" build; then
    BIN="$BUILD/tests/device"
    APIARY="$BUILD/apiary"
fi

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
    # A failed kernel test again under compute-sanitizer (bad accesses and
    # races), so the next session starts from the cause.
    failing="$(sed -n 's/^\[  FAILED  \] \([A-Za-z0-9_.]*\) (.*/\1/p' "$OUT/kernels.log" | sort -u |
        paste -sd: -)"
    if [ -n "$failing" ] && command -v compute-sanitizer >/dev/null; then
        stage sanitizer 90 "$OUT/kernels.log" compute-sanitizer --tool memcheck \
            "$BIN/test_cuda_kernels" --gtest_color=no --gtest_filter="$failing"
    fi
else
    log "kernels: SKIPPED (no build and no bundle)"
    failed+=(kernels)
fi

# ---- 3b. NCCL on this GPU (a group of one) ----
if [ -n "$BIN" ] && [ -x "$BIN/test_cuda_nccl" ]; then
    before=$(wc -l < "$OUT/kernels.log")
    stage nccl 60 "$OUT/kernels.log" "$BIN/test_cuda_nccl" --gtest_color=no
    tail -n "+$((before + 1))" "$OUT/kernels.log" |
        grep -E '^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ test' | tee -a "$SUMMARY"
    if tail -n "+$((before + 1))" "$OUT/kernels.log" | grep -qE '^\[  SKIPPED \] [1-9]'; then
        log "nccl: NOT PROVEN (tests skipped)"
        failed+=(nccl-skipped)
    fi
fi

# ---- 4. bench: the measured peak ----
PEAK_TFLOPS=""
if [ -n "$BIN" ]; then
    stage bench 120 "$OUT/bench.jsonl" "$BIN/apiary_cuda_bench" 8192 10
    PEAK_TFLOPS="$(grep '"gemm_bf16"' "$OUT/bench.jsonl" | sed 's/.*"tflops": \([0-9.]*\).*/\1/')"
    log "bench: cuBLASLt bf16 peak ${PEAK_TFLOPS:-?} TFLOP/s (8192^3, random data)"
    grep '"bench"' "$OUT/bench.jsonl" | tee -a "$SUMMARY"
fi

# ---- 5. curves: the step on the CUDA kernels against the CPU kernels ----
curve() {  # name preset precision_gpu steps batch seq
    local name="$1" preset="$2" prec="$3" steps="$4" b="$5" t="$6"
    local common=(--preset "$preset" --steps "$steps" --batch "$b" --seq "$t" --warmup 2)
    local tmp="${TMPDIR:-/tmp}" gpu_out cpu_out
    gpu_out="$tmp/dc-curve-$name-gpu"
    # The CPU's fp32 curve of a (preset, steps, B, T) is made once and kept
    # for the run: the bf16 GPU curve compares with the same one.
    cpu_out="$tmp/dc-curve-$preset-$steps-$b-$t-cpu"
    echo "== $name: ${GPU_DEVICE:-cuda} $prec"
    "$BIN/apiary_device_train" --device "${GPU_DEVICE:-cuda}" --precision "$prec" "${common[@]}" \
        > "$gpu_out" || { cat "$gpu_out"; return 1; }
    if [ ! -s "$cpu_out" ]; then
        echo "== $name: cpu fp32"
        "$BIN/apiary_device_train" --device cpu --precision fp32 "${common[@]}" > "$cpu_out.part" ||
            { cat "$cpu_out.part"; return 1; }
        mv "$cpu_out.part" "$cpu_out"
    fi
    cat "$gpu_out" "$cpu_out"
    python3 - "$cpu_out" "$gpu_out" "$name" "$prec" <<'PY'
import json, sys
def run(p):
    rows = [json.loads(l) for l in open(p) if l.startswith("{")]
    return [r["loss"] for r in rows if "step" in r], [r for r in rows if r.get("summary")][-1]
(cpu, cs), (gpu, gs) = run(sys.argv[1]), run(sys.argv[2])
n = min(len(cpu), len(gpu))
worst = max(abs(a - b) / abs(a) for a, b in zip(cpu[:n], gpu[:n]))
tol = 1e-2 if sys.argv[4] == "fp32" else 5e-2
print(f"curve {sys.argv[3]} ({sys.argv[4]} on cuda vs fp32 on cpu), {n} steps: loss "
      f"{cpu[0]:.4f} -> {cpu[n-1]:.4f} (cpu) / {gpu[0]:.4f} -> {gpu[n-1]:.4f} (cuda), worst "
      f"relative difference {worst:.2e} (tolerance {tol:g}); step {cs['median_step_ms']:.0f} ms "
      f"cpu / {gs['median_step_ms']:.1f} ms cuda")
sys.exit(0 if n > 1 and worst < tol else 1)
PY
}
speed() {  # the throughput run: GPT-2 124M bf16 at B=8, T=1024
    "$BIN/apiary_device_train" --device cuda --precision bf16 --preset gpt2-124m --batch 8 \
        --seq 1024 --steps 15 --warmup 5 --peak-tflops "${PEAK_TFLOPS:-0}"
}
export BIN OUT PEAK_TFLOPS
if [ -n "$BIN" ] && [ -x "$BIN/apiary_device_train" ]; then
    rm -f "${TMPDIR:-/tmp}"/dc-curve-*
    stage curve-gpt2 150 "$OUT/train.log" curve gpt2-124m gpt2-124m fp32 50 4 128
    stage curve-gpt2-bf16 40 "$OUT/train.log" curve gpt2-124m-bf16 gpt2-124m bf16 50 4 128
    stage curve-llama 90 "$OUT/train.log" curve llama-60m llama-60m fp32 50 4 128
    stage speed 90 "$OUT/train.log" speed
    grep -E '^curve ' "$OUT/train.log" | tee -a "$SUMMARY"
    grep '"summary"' "$OUT/train.log" | tail -n 1 | tee -a "$SUMMARY"
else
    log "curves: SKIPPED (no apiary_device_train)"
    failed+=(curves)
fi

# ---- 7. the trainer ----
trainer() {
    "$APIARY" train --overwrite --set run.dir=runs/dc-trainer --set train.device=cuda \
        --set train.steps=2
}
export APIARY
if [ -n "$APIARY" ] && [ -x "$APIARY" ]; then
    stage trainer 30 "$OUT/train.log" trainer
else
    log "trainer: SKIPPED (no apiary binary: the bundle carries the GPU check binaries only)"
fi

# ---- 8. torch peer ----
if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    stage torch 150 "$OUT/torch.log" env PYTHONUNBUFFERED=1 python3 tools/ref/bench_torch.py \
        --device cuda --preset gpt2-124m --batch 8 --seq 1024 --precision bf16 --steps 10 \
        --warmup 3
    python3 - "$OUT/torch.log" "${PEAK_TFLOPS:-0}" <<'PY' | tee -a "$SUMMARY"
import json, sys
r = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")][-1]
peak = float(sys.argv[2]) * 1e12
L, C, T, V = 12, 768, r["seq"], 50257
# apiary's count (core::ModelSpec::train_flops_per_token, PaLM's): 6 per
# matmul weight (all parameters but the position table; norms and biases
# are a rounding error) + 12 L T C for attention.
n = r["params"] - 1024 * C
flops_per_token = 6 * n + 12 * L * T * C
mfu = r["tokens_per_s"] * flops_per_token / peak if peak > 0 else float("nan")
print(f"torch eager {r['gpu']}: {r['tokens_per_s']:.0f} tokens/s, step {r['step_time_s']*1e3:.1f} ms, "
      f"MFU {mfu:.1%} of the measured bf16 peak ({sys.argv[2]} TFLOP/s)")
PY
else
    log "torch: SKIPPED (no PyTorch with CUDA)"
fi

log "done in $(($(date +%s) - START))s; failed stages: ${failed[*]:-none}"
[ ${#failed[@]} -eq 0 ]
