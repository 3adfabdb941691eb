#!/usr/bin/env bash
# README command 1: install dependencies, build, run the main job on its
# built-in defaults (a 2048-token BPE trained on the King James Bible, cached
# in .cache/apiary-shards with the Bible's token shards, then the tiny GPT on
# those tokens, into runs/default), then sample text decoded with the run's
# tokenizer.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
./scripts/build.sh  # configured as test.sh configures it (warnings are errors)
./build/apiary train --overwrite
./build/apiary generate --run runs/default --prompt "And God said" --tokens 120
