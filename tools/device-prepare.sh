#!/usr/bin/env bash
# On this machine, before a GPU lease: fill device-carry/ (git-ignored) with what the lent
# machine may lack: wheels of the harness's pure-Python dependencies and of flax and optax
# for its Python 3.12, and the offline MNIST files. Then call the device tool with
# carry: ["device-carry"].
set -euo pipefail
carry=device-carry
mkdir -p "$carry/wheelhouse" "$carry/mnist"
platforms=(--only-binary=:all: --python-version 3.12 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
python3 -m pip download --quiet "${platforms[@]}" -d "$carry/wheelhouse" "pydantic>=2.6" "rich>=13" "threadpoolctl>=3.1" pyyaml nox
# flax and optax without their dependencies (jax, orbax, tensorstore, chex: the image's own);
# tools/device-run.sh installs only what the machine's Python lacks.
python3 -m pip download --quiet --no-deps "${platforms[@]}" -d "$carry/wheelhouse" "flax==0.12.8" "optax>=0.2.4"
cp -n ../shared/data/mnist/* "$carry/mnist/" 2>/dev/null || echo "no ../shared/data/mnist: MNIST will be skipped or downloaded"
# gpl_transformer's text, in case the lent image has no /usr/share/common-licenses (its sha256 is checked there too)
cp -n /usr/share/common-licenses/GPL-3 "$carry/mnist/" 2>/dev/null || echo "no GPL-3 here: gpl_transformer will look for it on the lent machine"
du -sh "$carry"
