#!/usr/bin/env bash
# README command 1: install dependencies, build, run the main job on its
# built-in defaults (the tiny GPT on the King James Bible, into runs/default),
# then sample text from it.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
./scripts/build.sh
./build/apiary train --overwrite
./build/apiary generate --run runs/default --prompt "And God said" --tokens 400
