#!/usr/bin/env bash
# One call on a lent GPU machine (the `device` tool; see docs/gpu-machine.md).
# Runs `harness run --devices cpu,gpu --tf32 --require-gpu` (or, with `bench` first,
# `harness bench --devices cpu,gpu --require-gpu`: eager and fast modes against the floor)
# with a time budget, keeping every finished run in a work folder, and leaves two archives
# in $OUT: the records and the work folder. Carry the work folder back (`carry:
# ["device-carry"]`) and call again: runs that finished are reused, so a matrix longer
# than one call completes over several.
#
#   tools/device-run.sh smoke [SPEC ...]     first: a minute or two, $OUT/smoke.json
#   tools/device-run.sh [bench] [harness options, e.g. moons_net]
#
# Needs: python3 with the CUDA builds of torch, jax and cupy; pydantic and the rest from
# device-carry/wheelhouse (tools/device-prepare.sh); MNIST files in device-carry/mnist.
set -euo pipefail
: "${OUT:?set OUT to the folder whose files come back}"
carry=device-carry
work=$carry/work
# The machine's own CUDA builds of torch, jax and cupy stay, and so does every package its
# Python has already: only the carried wheels of packages it lacks are installed, into a
# folder of their own on PYTHONPATH (the device README's way), never into the image's Python.
if [ -d "$carry/wheelhouse" ]; then
    missing=()
    for wheel in "$carry"/wheelhouse/*.whl; do
        name=$(basename "$wheel" | cut -d- -f1)
        python3 -c 'import importlib.metadata as m, sys; m.version(sys.argv[1])' "$name" 2>/dev/null || missing+=("$wheel")
    done
    if [ "${#missing[@]}" -gt 0 ]; then
        echo "installing what this Python lacks: ${missing[*]##*/}"
        python3 -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "${missing[@]}"
        export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
    fi
fi
export XLA_PYTHON_CLIENT_PREALLOCATE=false
mkdir -p "$work"
[ -f "$carry/work.tar.gz" ] && tar -xzf "$carry/work.tar.gz" -C "$carry"
export HARNESS_DATA_DIR=${HARNESS_DATA_DIR:-$PWD/$carry/mnist}
mnist=(--data-dir "$HARNESS_DATA_DIR" --data-source test-set)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
if [ "${1:-}" = smoke ]; then
    # The first call: every adapter, spec network, precision and mode on the GPU for a few
    # steps, the math-mode flags read back; its JSON comes back in $OUT (a minute or two).
    shift
    rc=0
    timeout --signal=INT --kill-after=30 "${BUDGET_S:-480}" python3 -m harness smoke --devices gpu --out "$OUT/smoke.json" "$@" || rc=$?
    echo "harness smoke exit code: $rc (1: a row failed, see above)"
    exit "$rc"
fi
command=(run --tf32)
if [ "${1:-}" = bench ]; then
    command=(bench)
    shift
fi
rc=0
# INT first (the harness keeps every finished cell and exits 130), KILL 30 s later if it
# hangs; the default leaves the archives time inside the device's 600 s limit.
timeout --signal=INT --kill-after=30 "${BUDGET_S:-480}" python3 -m harness "${command[@]}" --devices cpu,gpu --require-gpu \
    --work-dir "$work" --results results-device "${mnist[@]}" "$@" || rc=$?
tar -czf "$OUT/work.tar.gz" -C "$carry" work
[ -d results-device ] && tar -czf "$OUT/records.tar.gz" results-device
echo "harness exit code: $rc (124/130: the budget ran out; call again with the work folder carried back)"
exit "$rc"
