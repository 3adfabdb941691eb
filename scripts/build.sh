#!/usr/bin/env bash
# Configures and builds apiary into ./build (Release). Extra arguments go to
# cmake's configure step, e.g. -DAPIARY_WERROR=ON.
set -euo pipefail
cd "$(dirname "$0")/.."
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
if [ ! -f build/CMakeCache.txt ]; then
    cmake -S . -B build "${generator[@]}" -DCMAKE_BUILD_TYPE=Release "$@"
elif [ $# -gt 0 ]; then
    cmake -S . -B build "$@"
fi
cmake --build build --parallel "$(nproc)"
