#!/usr/bin/env bash
# Run HERE (the build machine), before a device session: builds the GPU check
# binaries and copies them, with the shared libraries they need that a CUDA
# machine's image does not carry (oneDNN, fmt, ...), into .device/ (ignored by
# git). Name .device in the device tool's `carry`; scripts/device-check.sh
# uses it when it cannot build there. Not carried: glibc, libstdc++/libgcc
# (the device's are newer and compatible), the driver, cuBLAS/cuBLASLt
# (~500 MB; the device's CUDA 13 has them) and NCCL (pip's wheel there).
# The CUDA runtime the binaries were built against (0.7 MB) is carried.
#   scripts/device-bundle.sh [build dir, default build]
set -euo pipefail
cd "$(dirname "$0")/.."
# Its own build folder: portable code (no -march=native of this CPU, which the
# device's may not have), CUDA required.
build="${1:-build-bundle}"
targets=(test_cuda_kernels test_cuda_nccl apiary_cuda_bench apiary_device_train)
exclude="$(git rev-parse --git-path info/exclude)"
mkdir -p "$(dirname "$exclude")"
grep -qx '/.device/' "$exclude" 2>/dev/null || echo '/.device/' >> "$exclude"
if [ ! -f "$build/CMakeCache.txt" ]; then
    cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DAPIARY_WERROR=ON -DAPIARY_CUDA=ON \
        -DAPIARY_NATIVE=OFF -DAPIARY_BUILD_BENCH=OFF $(command -v ccache >/dev/null &&
        echo -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
ninja -C "$build" "${targets[@]}" apiary_cuda
rm -rf .device && mkdir -p .device/bin .device/lib
for t in "${targets[@]}"; do cp "$build/tests/device/$t" .device/bin/; done
# The CUDA module the device layer loads (beside the binaries, where it looks).
cp "$build/libapiary_cuda.so" .device/bin/
skip='^(libc|libm|libdl|librt|libpthread|ld-linux-x86-64|libstdc\+\+|libgcc_s|libcuda|libcublas|libcublasLt|libnccl|linux-vdso)\.'
for bin in .device/bin/*; do
    ldd "$bin" | awk '/=> \// {print $1, $3}'
done | sort -u | while read -r name path; do
    [[ "$name" =~ $skip ]] && continue
    cp -L "$path" ".device/lib/$name"
done
du -sh .device
echo "carry: .device   (device-check.sh finds it)"
