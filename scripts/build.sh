#!/usr/bin/env bash
# Configures and builds apiary into ./build (Release). Extra arguments go to
# cmake's configure step, e.g. -DAPIARY_WERROR=OFF.
#
# Warnings are errors by default, so that demo.sh and test.sh configure the
# shared ./build alike: a build for the demo is the one the tests use, not
# recompiled under other flags. A -D flag whose value the cache already
# holds is not passed again (cmake would reconfigure, and a changed compile
# flag recompiles everything).
set -euo pipefail
cd "$(dirname "$0")/.."
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
if [ ! -f build/CMakeCache.txt ]; then
    cmake -S . -B build "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DAPIARY_WERROR=ON "$@"
else
    changed=()
    for arg in "$@"; do
        if [[ "$arg" =~ ^-D([A-Za-z0-9_]+)(:[A-Z]+)?=(.*)$ ]]; then
            name="${BASH_REMATCH[1]}"
            value="${BASH_REMATCH[3]}"
            cached="$(sed -n "s/^${name}:[A-Z]*=//p" build/CMakeCache.txt | head -n 1)"
            [ "$cached" = "$value" ] && continue
        fi
        changed+=("$arg")
    done
    if [ ${#changed[@]} -gt 0 ]; then
        cmake -S . -B build "${changed[@]}"
    fi
fi
cmake --build build --parallel "$(nproc)"
