#!/usr/bin/env bash
# On this machine, before a GPU lease: fill device-carry/ (git-ignored) with what the lent
# machine lacks: wheels of the harness's pure-Python dependencies for its Python 3.12, and
# the offline MNIST files. Then call the device tool with carry: ["device-carry"].
set -euo pipefail
carry=device-carry
mkdir -p "$carry/wheelhouse" "$carry/mnist"
python3 -m pip download --quiet --only-binary=:all: --python-version 3.12 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$carry/wheelhouse" "pydantic>=2.6" "rich>=13" "threadpoolctl>=3.1" pyyaml nox
cp -n ../shared/data/mnist/* "$carry/mnist/" 2>/dev/null || echo "no ../shared/data/mnist: MNIST will be skipped or downloaded"
du -sh "$carry"
