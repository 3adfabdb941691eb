#!/usr/bin/env bash
# README command 2 (and .ci/run): install dependencies, build with warnings as
# errors, run every test, slow ones included. Extra arguments go to ctest,
# e.g. `scripts/test.sh -LE slow` while iterating.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
# Warnings as errors (build.sh's default; named here for CI): a build that
# demo.sh left with the same setting is reused as it is.
./scripts/build.sh -DAPIARY_WERROR=ON
# Tests size their own thread counts; two at a time fills the two cores CI has.
ctest --test-dir build --output-on-failure --timeout 1500 -j "$(nproc)" "$@"
