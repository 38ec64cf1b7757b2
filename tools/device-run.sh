#!/usr/bin/env bash
# One call on a lent GPU machine (the `device` tool; see docs/gpu-machine.md).
# Runs `harness run --devices cpu,gpu --tf32 --require-gpu` (or, with `bench` first,
# `harness bench --devices cpu,gpu --require-gpu`: eager and fast modes against the floor)
# with a time budget, keeping every finished run in a work folder, and leaves two archives
# in $OUT: the records and the work folder. Carry the work folder back (`carry:
# ["device-carry"]`) and call again: runs that finished are reused, so a matrix longer
# than one call completes over several.
#
#   tools/device-run.sh contact              a lease's one call (about 9 minutes): moons (quick),
#                                            bench, matrix, references (GPU, then CPU), port,
#                                            the Python API, smoke, bf16, seeds, GPU tests, each with a budget of its own
#   tools/device-run.sh smoke [SPEC ...]     first: a minute or two, $OUT/smoke.json
#   tools/device-run.sh [bench] [harness options, e.g. moons_net]
#
# REHEARSAL=1 runs any of them on this machine's CPU instead (no --require-gpu, the GPU
# devices replaced by the CPU): the shell's logic, budgets and archives, no GPU figure.
#
# Needs: python3 with the CUDA builds of torch, jax and cupy; pydantic and the rest from
# device-carry/wheelhouse (tools/device-prepare.sh); MNIST files in device-carry/mnist.
set -euo pipefail
: "${OUT:?set OUT to the folder whose files come back}"
carry=${CARRY:-device-carry}  # what the call carried; CARRY and RESULTS move them (a rehearsal's test)
results=${RESULTS:-results-device}
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
gpu=gpu both=cpu,gpu need=(--require-gpu) smoked=${SMOKE_FRAMEWORKS:-cupy} arrays=cupy
if [ -n "${REHEARSAL:-}" ]; then
    echo "REHEARSAL: on this machine's CPU; nothing here is a GPU figure"
    gpu=cpu both=cpu need=() smoked=${SMOKE_FRAMEWORKS:-numpy} arrays=numpy  # CuPy's code on the CPU
fi
mkdir -p "$work"
[ -f "$carry/work.tar.gz" ] && tar -xzf "$carry/work.tar.gz" -C "$carry"
export HARNESS_DATA_DIR=${HARNESS_DATA_DIR:-$(cd "$carry" && pwd)/mnist}
mnist=(--data-dir "$HARNESS_DATA_DIR" --data-source test-set)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true

# One phase of `contact`: its own budget (INT, then KILL 10 s later), its exit code said,
# and the phases after it run whatever it returned.
phase() {
    local name=$1 budget=$2 rc=0
    shift 2
    echo "== $name (budget ${budget} s, $(date -u +%H:%M:%S)): $*"
    SECONDS=0
    timeout --signal=INT --kill-after=10 "$budget" "$@" || rc=$?
    case $rc in
        124 | 130 | 137) echo "== $name: exit code $rc after ${SECONDS} s: its budget ran out; what it finished is kept" ;;
        *) echo "== $name: exit code $rc after ${SECONDS} s" ;;
    esac
    summary+=("$name $rc ${SECONDS}s")
}

# The records, and the finished cells for a call that resumes them, into $OUT; the cells
# only where the device tool brings the file back (16 MiB a file): a warm machine keeps
# them in $work for the next call anyway.
archives() {
    local kept=()
    for folder in "$results" "$results-cpu-references"; do
        if [ -d "$folder" ]; then kept+=("$(basename "$folder")"); fi
    done
    if [ "${#kept[@]}" -gt 0 ]; then tar -czf "$OUT/records.tar.gz" -C "$(dirname "$results")" "${kept[@]}"; fi
    tar -czf "$OUT/work.tar.gz" -C "$carry" work
    if [ "$(stat -c %s "$OUT/work.tar.gz")" -gt $((15 * 1024 * 1024)) ]; then
        rm "$OUT/work.tar.gz"
        echo "work.tar.gz is over 15 MiB and would not come back: the finished cells stay in $work on this machine"
    fi
}

contact() {
    summary=()
    local jobs=${JOBS:-$(( $(nproc) / 2 < 1 ? 1 : ($(nproc) / 2 > 8 ? 8 : $(nproc) / 2) ))}  # half the cores, at most 8
    python3 -c 'import sys, torch, jax, numpy; print(sys.version.split()[0], "torch", torch.__version__, torch.version.cuda, "jax", jax.__version__, jax.devices(), "numpy", numpy.__version__)' || true
    # In the order of issue 51's priorities (docs/gpu-machine.md): moons_net, which has no GPU
    # record yet, at its quick size (its full CPU side is hours on any host; the records'
    # names say the profile); the bench's fast modes against the GPU's floor (the CPU's are
    # in the committed records); the matrix of the first specs without GPU records, 8 cells
    # at a time on a 16-core host
    phase moons "${MOONS_S:-90}" python3 -m harness run --tf32 --devices "$both" "${need[@]}" --jobs "$jobs" \
        --work-dir "$work" --results "$results" --profile "${MOONS_PROFILE:-quick}" ${MOONS_SPECS:-moons_net}
    phase bench "${BENCH_S:-70}" python3 -m harness bench --devices "$gpu" "${need[@]}" --repeats 3 \
        --results "$results" "${mnist[@]}" ${BENCH_SPECS:-peaks_mlp mnist_mlp moons_net}
    phase matrix "${MATRIX_S:-105}" python3 -m harness run --tf32 --devices "$both" "${need[@]}" --jobs "$jobs" \
        --work-dir "$work" --results "$results" "${mnist[@]}" ${MATRIX_SPECS:-lenet_mnist cnn_norm_mnist mnist_adamw gpl_transformer}
    # the oracle, its members and the calibration run on the GPU through CuPy (--references
    # gpu; tested on the CPU with NumPy standing in, tests/test_gpu_references.py): peaks on
    # its whole 40,000-point grid for 100 steps (its sweep profile); then the same CuPy run
    # judged by the CPU's references (NumPy), into a folder of its own: the verdict's cost on
    # each device, taken in one call with the same jobs, and whether the verdicts agree
    phase references "${REFS_S:-35}" python3 -m harness run --references "$gpu" --devices "$gpu" "${need[@]}" --frameworks "$smoked" \
        --jobs "$jobs" --profile "${REFS_PROFILE:-sweep}" --results "$results" ${REFS_SPECS:-peaks_mlp}
    phase references-cpu "${REFS_CPU_S:-35}" python3 -m harness run --references cpu --devices "$gpu" "${need[@]}" --frameworks "$smoked" \
        --jobs "$jobs" --profile "${REFS_PROFILE:-sweep}" --results "$results-cpu-references" ${REFS_SPECS:-peaks_mlp}
    # a user's own model (issue 42): three committed ports (a text port among them, issue 52), torch and flax, CPU and GPU
    phase port "${PORT_S:-40}" python3 -m harness run --devices "$both" "${need[@]}" --frameworks torch,jax --jobs "${JOBS:-$(( $(nproc) < 4 ? $(nproc) : 4 ))}" \
        --work-dir "$work" --results "$results" ${PORT_SPECS:-examples/mlp_port/mlp_port.yaml examples/cnn_port/cnn_port.yaml examples/text_port/text_port.yaml}
    # the Python API (issue 53): the README's port example through harness.check_port, CPU and
    # GPU, the slip (it fails before training) and the honest port, records under $results/api_port*
    phase api "${API_S:-25}" python3 tools/api_contact.py --devices "$both" --results "$results"
    # the smoke's rows the first contact did not reach (CuPy's, its fast mode without graphs
    # among them; torch's and JAX's ran): last, as the issue ranks them
    phase smoke "${SMOKE_S:-20}" python3 -m harness smoke --devices "$gpu" --frameworks "$smoked" --out "$OUT/smoke.json" ${SMOKE_SPECS:-}
    # what landed since (issue 86): bf16 on the tensor cores, torch's autocast and flax in
    # bfloat16 on MNIST's MLP, CPU and GPU, and CuPy's array-module code rounding to bfloat16
    # where autocast computes in it (harness/reference/autocast.py), judged on the bf16 envelope
    # (torch's autocast runs, on the CPU); then the verdict over seeds on the GPU, peaks at 5
    # seeds. Both measured, not gated
    phase bf16 "${BF16_S:-20}" python3 -m harness run --devices "$both" "${need[@]}" --frameworks "torch,jax,$arrays" --precisions float32,bf16 \
        --jobs "$jobs" --work-dir "$work" --results "$results" --profile quick "${mnist[@]}" ${BF16_SPECS:-mnist_mlp}
    phase seeds "${SEEDS_S:-15}" python3 -m harness run --devices "$gpu" "${need[@]}" --frameworks torch,jax --seeds 5 \
        --jobs "$jobs" --results "$results" --profile quick ${SEEDS_SPECS:-peaks_mlp}
    phase gpu-tests "${TESTS_S:-15}" python3 -m pytest -m gpu -q -p no:cacheprovider --junitxml="$OUT/pytest-gpu.xml" ${TESTS:-tests}
    archives
    printf 'phase exit-code seconds: %s\n' "${summary[@]}"
}

if [ "${1:-}" = contact ]; then
    # The whole contact in one call, for a lease of 15 device minutes (a machine's start,
    # this call of at most 600 s, a second call only while it is still warm). The budgets
    # add up to 470 s (580 with every phase killed 10 s after its INT), which leaves
    # the archives time inside a call's 600 s; what each phase finished is kept. The matrix
    # times CPU against GPU (the speedups); the references phases time the verdict on either
    # device; the bench adds the GPU's fast modes and floor (the CPU's are in the committed
    # records). $OUT gets contact.log, smoke.json, pytest-gpu.xml, records.tar.gz (the
    # records, and those judged by the CPU's references apart) and work.tar.gz.
    contact 2>&1 | tee "$OUT/contact.log"
    exit 0
fi
if [ "${1:-}" = smoke ]; then
    # The first call: every adapter, spec network, precision and mode on the GPU for a few
    # steps, the math-mode flags read back; its JSON comes back in $OUT (a minute or two).
    shift
    rc=0
    timeout --signal=INT --kill-after=30 "${BUDGET_S:-480}" python3 -m harness smoke --devices "$gpu" --out "$OUT/smoke.json" "$@" || rc=$?
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
timeout --signal=INT --kill-after=30 "${BUDGET_S:-480}" python3 -m harness "${command[@]}" --devices "$both" "${need[@]}" \
    --work-dir "$work" --results "$results" "${mnist[@]}" "$@" || rc=$?
archives
echo "harness exit code: $rc (124/130: the budget ran out; call again with the work folder carried back)"
exit "$rc"
