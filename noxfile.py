"""Sessions: `nox -s cpu` (the main job), `nox -s tests` (the test suite), `nox -s regress`
(the quick profile against the committed baseline), `nox -s report` (results/REPORT.md).

Policy: pip, never uv (the local pip configuration holds the CPU build of torch); torch is
pinned to 2.13.0 in pyproject's extras, as an unpinned torch pulls a multi-GB CUDA build.
"""

from __future__ import annotations

import os
import shutil
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
    data folder, else the offline test-set files beside the checkout, else a download."""
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
    return ["--download"]


def _install(session: nox.Session, *extras: str) -> None:
    session.install("-e", f".[{','.join(extras)}]")


@nox.session
def cpu(session: nox.Session) -> None:
    """Every spec, full size, in every framework plus the float64 oracle, on the CPU; records in results/."""
    _install(session, "torch", "jax")
    session.run("python", "-m", "harness", "run", "--devices", "cpu", *_mnist_options(session), *session.posargs)


@nox.session
def tests(session: nox.Session) -> None:
    """The test suite (pytest and hypothesis), on the CPU."""
    _install(session, "torch", "jax", "test")
    env = {}
    if not os.environ.get("HARNESS_DATA_DIR") and OFFLINE_MNIST.is_dir():
        env["HARNESS_DATA_DIR"] = str(OFFLINE_MNIST)
    session.run("python", "-m", "harness", "schema", "--check")
    session.run("pytest", *session.posargs, env=env)


@nox.session
def regress(session: nox.Session) -> None:
    """The quick profile on the CPU, compared with the committed baseline (baselines/cpu-quick)."""
    _install(session, "torch", "jax")
    new = Path(session.create_tmp()) / "records"
    shutil.rmtree(new, ignore_errors=True)
    options = ["--profile", "quick", "--devices", "cpu", "--results", str(new), *_mnist_options(session)]
    session.run("python", "-m", "harness", "run", *options, success_codes=[0, 1])
    session.run("python", "-m", "harness", "compare", str(new), "--baseline", "baselines/cpu-quick", *session.posargs)


@nox.session
def report(session: nox.Session) -> None:
    """results/REPORT.md and its figures, from the committed records (no training)."""
    _install(session, "report")
    session.run("python", "-m", "harness", "report", *session.posargs)
