"""Shared fixtures: spec paths, the offline MNIST folder, quick problems, the oracle's first step."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from adapters.jax_adapter import DETERMINISTIC_FLAG

# Before anything imports JAX (tests import it in this process and start runs in children):
# JAX would take 75% of the GPU's memory at its first use, leaving the children little, and
# XLA reads its flags once, when its backend starts.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
if DETERMINISTIC_FLAG not in os.environ.get("XLA_FLAGS", "").split():
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {DETERMINISTIC_FLAG}".strip()

from harness.core import registry  # noqa: E402
from harness.core.paths import SPECS_DIR  # noqa: E402
from harness.core.registry import RunKey  # noqa: E402
from harness.inputs import data
from harness.inputs import problem as inputs
from harness.spec.load import load_spec  # noqa: E402
from harness.spec.model import Close  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
# The unit tests' own allclose tolerances for one adapter against the oracle over a step or
# a few (the matrix's checks are calibrated per spec; these are a test's fixed bar, set
# from float32 rounding: a reduction over n terms is off by about sqrt(n) * 6e-8).
UNIT_TOLERANCES = SimpleNamespace(
    initial_outputs=Close(rtol=1e-5, atol=2e-6),
    initial_loss=Close(rtol=2e-5, atol=0.0),
    params_after_first_step=Close(rtol=1e-5, atol=1e-6),
    params_after_steps=Close(rtol=1e-4, atol=1e-5),
)
SHARED_MNIST = ROOT.parent / "shared" / "data" / "mnist"


def offline_mnist_dir() -> Path | None:
    """A folder with the real MNIST test-set files: $HARNESS_DATA_DIR, ../shared/data/mnist,
    else the files the harness ships (harness/data/mnist/: a fresh clone's)."""
    for candidate in (os.environ.get(data.DATA_DIR_ENV), SHARED_MNIST, data.EMBEDDED_DIR):
        if candidate and (Path(candidate) / "t10k-images-idx3-ubyte.gz").is_file():
            return Path(candidate)
    return None


@pytest.fixture
def mnist_dir() -> Path:
    found = offline_mnist_dir()
    if found is None:
        pytest.skip("the real MNIST test-set files are not here: set HARNESS_DATA_DIR to a folder holding them")
    return found


def quick_problem(name: str, mnist: Path | None = None) -> inputs.Problem:
    loaded = load_spec(SPECS_DIR / f"{name}.yaml", "quick")
    if name == "mnist_mlp":
        return inputs.build_problem(loaded, mnist, "test-set")
    return inputs.build_problem(loaded)


def problem_or_skip(name: str) -> inputs.Problem:
    """A spec's quick problem; MNIST's on the offline test-set files, or a skip that says why."""
    if name == "mnist_mlp":
        folder = offline_mnist_dir()
        if folder is None:
            pytest.skip("the real MNIST test-set files are not here: set HARNESS_DATA_DIR")
        return quick_problem(name, folder)
    return quick_problem(name)


CPU_FRAMEWORKS = [f for f in registry.ADAPTERS if registry.runs_on(f, "cpu")]
GPU_FRAMEWORKS = [f for f in registry.ADAPTERS if registry.runs_on(f, "gpu")]


def key_for(adapter, device: str = "cpu", dtype: str = "float32", mode: str = "eager") -> RunKey:
    """The run key an adapter module is called with, for one device, dtype and mode."""
    framework = adapter.NAME if adapter.NAME != "xp" else ("numpy" if device == "cpu" else "cupy")
    return RunKey(framework, device, precision="float64" if dtype == "float64" else "strict", mode=mode)


def trainer_of(adapter, problem, device: str = "cpu", dtype: str = "float32", mode: str = "eager"):
    """A built trainer: the problem's data put on the device, the initial state, nothing run."""
    key = key_for(adapter, device, dtype, mode)
    return adapter.build(problem, adapter.put(problem, key), key)


def first_loss(adapter, trainer) -> float:
    adapter.train(trainer, 0, 1)
    return adapter.state(trainer, 1).losses[0]


def one_step(adapter, problem, dtype):
    """Probe outputs before, the first loss, and the parameters after one step on the CPU."""
    trainer = trainer_of(adapter, problem, "cpu", dtype)
    adapter.warm_up(trainer)
    outputs = adapter.predict(trainer, problem.probe)
    loss = first_loss(adapter, trainer)
    return outputs, loss, adapter.state(trainer, 1).params


@pytest.fixture(scope="module")
def oracle_step():
    """A spec's quick problem and the float64 oracle's one_step on it, computed once a module."""
    cache = {}

    def get(name):
        if name not in cache:
            problem = problem_or_skip(name)
            cache[name] = (problem, one_step(registry.load("numpy"), problem, "float64"))
        return cache[name]

    return get


@pytest.fixture
def members_from_the_start(monkeypatch):
    """A matrix plans the first look's members of every kind from the start, as it did before
    the zeroth look (harness/calibrate/roles.py ZEROTH): for the tests of what members do, where
    a zeroth look that passes would run none. Call it with roles.ALL for every member."""
    import functools

    from harness.calibrate import calibration, roles

    original = calibration.jobs

    def plan(part: str = roles.FIRST) -> None:
        monkeypatch.setattr(calibration, "jobs", functools.partial(original, part=part))

    plan()
    return plan
