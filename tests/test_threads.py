"""The array-module code's transcendental element-wise work on several threads
(harness/core/threads.py) gives the bits one call gives: function by function, and for
whole runs of the oracle and its members."""

from __future__ import annotations

import os
import platform
import signal
import time

import numpy as np
import pytest
from scipy.special import erf

from harness.core import threads
from harness.core.threads import GRAIN, pieces, split, unary

SIZES = [2 * GRAIN - 1, 2 * GRAIN, 3 * GRAIN + 17, 1_000_003]
SPECIAL = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-310, -1e-310, 1e-40, 20.0, -20.0, 700.0, -745.5, 1e300]


def values(n: int, dtype) -> np.ndarray:
    rng = np.random.default_rng(n)
    a = (rng.standard_normal(n) * rng.choice([1e-3, 1.0, 5.0, 40.0], n)).astype(dtype)
    with np.errstate(over="ignore"):
        a[: len(SPECIAL)] = np.array(SPECIAL).astype(dtype)
    a[-len(SPECIAL) :] = a[: len(SPECIAL)]  # the last piece's tail too
    return a


def bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint32 if a.dtype == np.float32 else np.uint64)


@pytest.mark.parametrize("n", [1, GRAIN, 2 * GRAIN - 1, 2 * GRAIN, 10 * GRAIN + 3, 1_000_003])
@pytest.mark.parametrize("parts", [1, 2, 3, 16])
def test_the_pieces_cover_every_element_once_and_none_is_under_a_grain(n, parts):
    cut = pieces(n, parts)
    assert cut[0][0] == 0 and cut[-1][1] == n
    assert all(stop == start for (_, stop), (start, _) in zip(cut[:-1], cut[1:]))
    assert len(cut) <= parts
    assert len(cut) == 1 or min(stop - start for start, stop in cut) >= GRAIN


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", ["tanh", "exp", "erf"])
@pytest.mark.parametrize("cap", ["2", "3", "7"])
def test_a_function_on_several_threads_gives_one_calls_bits(name, dtype, cap, monkeypatch):
    monkeypatch.setenv("HARNESS_THREADS", cap)
    function = {"tanh": np.tanh, "exp": np.exp, "erf": erf}[name]
    for n in SIZES:
        x = values(n, dtype).reshape(-1, 1) if n % 2 else values(n, dtype).reshape(2, -1)
        with np.errstate(over="ignore", invalid="ignore"):  # the pieces' too
            whole = function(x)
            split_up = unary(np, function, x)
            into = np.empty_like(x)
            unary(np, function, x, out=into)
        assert split_up.dtype == whole.dtype and split_up.shape == whole.shape
        assert np.array_equal(bits(split_up), bits(whole)), (name, n)
        assert np.array_equal(bits(into), bits(whole)), (name, n)


def test_what_cannot_be_split_is_one_call(monkeypatch):
    """Strided views, other dtypes and other array modules go to the function as they are."""
    monkeypatch.setenv("HARNESS_THREADS", "2")
    x = values(4 * GRAIN, np.float64).reshape(2, -1)
    calls = []

    def spy(a, out=None):
        calls.append(a.shape)
        return np.tanh(a) if out is None else np.tanh(a, out=out)

    assert np.array_equal(bits(unary(np, spy, x.T)), bits(np.tanh(x.T))) and calls == [x.T.shape]
    calls.clear()
    with np.errstate(over="ignore"):
        unary(np, spy, x.astype(np.float16))
    assert calls == [x.shape]
    calls.clear()
    unary(np, spy, x)
    assert len(calls) == 2 and sum(c[0] for c in calls) == x.size
    assert not threads.splittable(object(), x)


def test_a_piece_that_fails_fails_the_call(monkeypatch):
    monkeypatch.setenv("HARNESS_THREADS", "2")
    seen = []

    def work(start, stop):
        seen.append(start)
        if start:
            raise ValueError(f"piece at {start}")

    with pytest.raises(ValueError, match="piece at"):
        split(4 * GRAIN, work)
    assert sorted(seen) == [0, 2 * GRAIN]

    finished = []

    def first_fails(start, stop):
        if not start:
            raise ValueError("the first piece")
        time.sleep(0.2)
        finished.append(start)

    with pytest.raises(ValueError, match="the first piece"):
        split(4 * GRAIN, first_fails)
    assert finished == [2 * GRAIN]  # the other pieces were done before it raised


def test_the_pieces_keep_the_callers_floating_point_error_handling(monkeypatch):
    monkeypatch.setenv("HARNESS_THREADS", "2")
    x = np.full(4 * GRAIN, 800.0)
    with np.errstate(over="raise"), pytest.raises(FloatingPointError):
        unary(np, np.exp, x)
    with np.errstate(over="ignore"):
        assert np.isinf(unary(np, np.exp, x)).all()


@pytest.mark.slow
def test_the_oracle_and_its_members_train_the_same_bits_on_any_number_of_threads(monkeypatch):
    """moons_net at its quick width (1,000 x 1,000 tanh values a step, split from 2 threads
    on), shortened: the oracle, a float64 member and a float32 member, on 1 and 3 threads."""
    from harness.core.paths import SPECS_DIR
    from harness.core.registry import ORACLE_KEY, RunKey
    from harness.inputs.members import reordered
    from harness.inputs.problem import build_problem
    from harness.run import runner
    from harness.spec.load import load_spec

    shorter = {"training": {"epochs": 40}, "checks": {"params_after_steps": {"step": 20}}}
    problem = build_problem(load_spec(SPECS_DIR / "moons_net.yaml", "quick", shorter))
    runs = [
        (problem, ORACLE_KEY),
        (reordered(problem, 1), RunKey("oracle", "cpu", "order1")),
        (reordered(problem, 2), RunKey("numpy", "cpu", "order2")),
    ]
    for p, key in runs:
        outcomes = []
        for cap in ("1", "3"):
            monkeypatch.setenv("HARNESS_THREADS", cap)
            outcomes.append(runner.run(p, key))
        one, three = outcomes
        assert one.status == three.status == "ok"
        assert np.array_equal(one.losses, three.losses), key.label
        for name, a in one.final_params.items():
            assert np.array_equal(three.final_params[name], a), (key.label, name)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_forked_child_splits_on_threads_of_its_own(monkeypatch):
    """A process forked after the pool started (the parent's threads do not follow it) still
    splits, instead of waiting forever on the parent's workers."""
    monkeypatch.setenv("HARNESS_THREADS", "2")
    x = values(4 * GRAIN, np.float64)
    unary(np, np.tanh, x)  # the parent's pool
    pid = os.fork()
    if pid == 0:
        signal.alarm(30)  # a child waiting on threads it does not have dies of it
        try:
            ok = np.array_equal(bits(unary(np, np.tanh, x)), bits(np.tanh(x)))
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_jobs_process_starts_with_openblas_threads_that_sleep_soon(monkeypatch):
    """A spawned job's process (harness/execute/fresh.py) has OpenBLAS's short spin, so that its
    BLAS threads leave the cores to the element-wise threads; a caller's own setting wins."""
    from harness.execute.capacity import WORKER_ENVIRONMENT
    from harness.execute.fresh import in_fresh_process

    monkeypatch.delenv("OPENBLAS_THREAD_TIMEOUT", raising=False)
    assert in_fresh_process(os.getenv, "OPENBLAS_THREAD_TIMEOUT") == WORKER_ENVIRONMENT["OPENBLAS_THREAD_TIMEOUT"]
    monkeypatch.setenv("OPENBLAS_THREAD_TIMEOUT", "24")
    assert in_fresh_process(os.getenv, "OPENBLAS_THREAD_TIMEOUT") == "24"


def _page_faults_of_arrays(steps: int) -> int:
    """The page faults of `steps` eager steps' worth of arrays (three of 8 MB allocated,
    written and freed each step), in this process."""
    import resource

    import numpy as np

    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(steps):
        arrays = [np.ones(1 << 20) for _ in range(3)]
        del arrays
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the allocator's thresholds are glibc's variables; other C libraries ignore them")
def test_a_jobs_process_keeps_the_arrays_it_frees_for_its_next_steps(monkeypatch):
    """A spawned job's process has glibc's mmap and trim thresholds at 1 GiB
    (capacity.WORKER_ENVIRONMENT): the arrays a step frees stay in the process for the
    next step's. With glibc's own thresholds each step takes their pages from the kernel
    again (here 50,985 page faults against 1,545 for 50 steps); a caller's own setting wins."""
    import subprocess
    import sys

    from harness.core.paths import PROJECT_ROOT
    from harness.execute.capacity import WORKER_ENVIRONMENT
    from harness.execute.fresh import in_fresh_process

    names = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")
    for name in names:
        monkeypatch.delenv(name, raising=False)
    glibcs = {k: v for k, v in os.environ.items() if k not in names}
    code = "from tests.test_threads import _page_faults_of_arrays as f; print(f(50))"
    default = int(subprocess.run([sys.executable, "-c", code], cwd=PROJECT_ROOT, env=glibcs, capture_output=True, text=True, check=True).stdout)
    ours = in_fresh_process(_page_faults_of_arrays, 50)
    assert ours < 5_000 < 20_000 < default, (ours, default)
    for name in names:
        assert in_fresh_process(os.getenv, name) == WORKER_ENVIRONMENT[name] == str(1 << 30)
        monkeypatch.setenv(name, str(128 << 10))
        assert in_fresh_process(os.getenv, name) == str(128 << 10)
