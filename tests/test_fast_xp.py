"""The array-module adapter's fast mode (adapters/xp_fast.py): on NumPy bitwise identical to the
eager array-module MLP, allocation-free per step, and warm_up leaves the state alone; on
the GPU (tests marked `gpu`, skipped with the reason where there is none) it agrees with the
eager CuPy run and repeats bitwise."""

from __future__ import annotations

import dataclasses
import tracemalloc
from dataclasses import replace

import numpy as np
import pytest

from adapters import xp_adapter
from harness.core.registry import RunKey
from harness.run import runner
from tests.conftest import key_for, problem_or_skip, quick_problem, trainer_of

# moons' quick profile is 500 steps of a 1000-unit layer: the eager float32 run alone takes
# 10-30 s on a shared 2-core host, so the bitwise test runs its first 60 steps.
MOONS_STEPS = 60


def shortened(problem, steps: int):
    spec = problem.spec
    training = spec.training.model_copy(update={"epochs": steps})
    checks = spec.checks.model_copy(update={"params_after_steps": spec.checks.params_after_steps.model_copy(update={"step": min(10, steps)})})
    return dataclasses.replace(problem, spec=spec.model_copy(update={"training": training, "checks": checks}))


def problem_for(name: str):
    problem = problem_or_skip(name)
    return shortened(problem, MOONS_STEPS) if name == "moons_net" else problem


def trained(problem, device: str, dtype: str, mode: str, upto: int | None = None):
    """Train as the runner does (warm_up with the plan, then train range by range)."""
    plan = runner.chunk_plan(problem)
    trainer = trainer_of(xp_adapter, problem, device, dtype, mode)
    xp_adapter.warm_up(trainer, plan)
    steps = problem.total_steps if upto is None else upto
    for start, stop in plan:
        if start >= steps:
            break
        xp_adapter.train(trainer, start, min(stop, steps))
    xp_adapter.synchronize(trainer)
    return xp_adapter.state(trainer, steps).losses, xp_adapter.state(trainer, 0).params


def assert_bitwise(a, b):
    (curve_a, params_a), (curve_b, params_b) = a, b
    differs = np.flatnonzero(curve_a != curve_b)
    assert not differs.size, f"loss curves differ from step {differs[0]}: {curve_a[differs[0]]!r} vs {curve_b[differs[0]]!r}"
    assert list(params_a) == list(params_b)
    for tensor, a in params_a.items():
        assert np.array_equal(a, params_b[tensor]), f"final {tensor} differs"


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("spec_name", ["peaks_mlp", "moons_net", "mnist_mlp"])
def test_fast_mode_is_bitwise_the_eager_mode_on_numpy(spec_name, dtype):
    problem = problem_for(spec_name)
    eager = trained(problem, "cpu", dtype, "eager")
    fast = trained(problem, "cpu", dtype, "fast")
    assert np.isfinite(eager[0]).all() and eager[0][-1] < eager[0][0], "the eager run did not train"
    assert_bitwise(fast, eager)


def test_adam_bias_corrections_round_like_python_floats():
    """The device tables (float64, then cast) hold what the network oracle's Python floats become."""
    problem = quick_problem("peaks_mlp")
    trainer = trainer_of(xp_adapter, problem, "cpu", "float32", "fast")
    opt = problem.spec.optimizer
    for t in (1, 2, 50, problem.total_steps):
        c1, c2 = 1 - opt.beta1**t, 1 - opt.beta2**t
        assert trainer.fast.c1[t - 1] == np.float32(c1) and trainer.fast.c2[t - 1] == np.float32(c2)
        assert trainer.fast.c1.dtype == np.float32


def _snapshot(trainer):
    return [np.array(a) for a in (*trainer.fast.state(), trainer.loss_log)]


@pytest.mark.parametrize("spec_name", ["peaks_mlp", "mnist_mlp"])
def test_warm_up_changes_nothing(spec_name):
    problem = problem_for(spec_name)
    trainer = trainer_of(xp_adapter, problem, "cpu", "float32", "fast")
    before = _snapshot(trainer)
    xp_adapter.warm_up(trainer, runner.chunk_plan(problem))
    xp_adapter.warm_up(trainer)
    for after, was in zip(_snapshot(trainer), before):
        assert np.array_equal(after, was)
    xp_adapter.train(trainer, 0, 3)
    cold = trainer_of(xp_adapter, problem, "cpu", "float32", "fast")
    xp_adapter.train(cold, 0, 3)
    assert np.array_equal(xp_adapter.state(trainer, 3).losses, xp_adapter.state(cold, 3).losses)


def _pointers(trainer):
    arrays = [*trainer.fast.buffers(), *trainer.params.values(), *(a for pair in trainer.fast.params for a in pair)]
    return [(id(a), a.ctypes.data) for a in arrays]


@pytest.mark.parametrize("spec_name", ["peaks_mlp", "moons_net", "mnist_mlp"])
def test_train_keeps_its_buffers_and_allocates_no_arrays(spec_name):
    problem = problem_for(spec_name)
    trainers = {}
    for mode in ("eager", "fast"):
        trainers[mode] = trainer_of(xp_adapter, problem, "cpu", "float32", mode)
        xp_adapter.warm_up(trainers[mode], [(0, 1), (1, 4)])
        xp_adapter.train(trainers[mode], 0, 1)
    fast = trainers["fast"]
    pointers, weights = _pointers(fast), {tensor: np.array(w) for tensor, w in fast.params.items() if tensor.endswith(".weight")}
    peaks = {}
    for mode, trainer in trainers.items():
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        xp_adapter.train(trainer, 1, 4)
        peaks[mode] = tracemalloc.get_traced_memory()[1] - base
        tracemalloc.stop()
    assert _pointers(fast) == pointers, "train replaced a preallocated array"
    assert weights and not all(np.array_equal(fast.params[tensor], w0) for tensor, w0 in weights.items()), "train left the weights alone"
    # What a fast step may allocate: NumPy's fixed-size iterator buffer (8,192 elements, for
    # the broadcast bias add) and small objects. The eager mode shows that the probe sees arrays.
    limit = 64 * 1024
    assert max(a.nbytes for a in fast.fast.buffers()) > limit
    assert peaks["eager"] > limit, f"the probe saw only {peaks['eager']} bytes in the eager mode"
    assert peaks["fast"] < limit, f"three fast steps allocated up to {peaks['fast']} bytes"


def test_describe_names_the_fast_mode():
    assert "fast_mode" not in xp_adapter.describe(key_for(xp_adapter, "cpu", mode="eager"))
    line = xp_adapter.describe(key_for(xp_adapter, "cpu", mode="fast"))["fast_mode"]
    assert line and "\n" not in line


def test_the_runner_runs_the_fast_mode():
    problem = shortened(quick_problem("peaks_mlp"), 30)
    outcomes = {mode: runner.run(problem, RunKey("numpy", "cpu", mode=mode)) for mode in ("eager", "fast")}
    assert all(o.status == "ok" for o in outcomes.values()), [o.reason for o in outcomes.values()]
    assert "fast_mode" in outcomes["fast"].describe
    assert np.array_equal(outcomes["fast"].losses, outcomes["eager"].losses)
    for step, snapshot in outcomes["eager"].snapshots.items():
        fast_snapshot = outcomes["fast"].snapshots[step]
        assert list(fast_snapshot) == list(snapshot)
        for tensor, a in snapshot.items():
            assert np.array_equal(fast_snapshot[tensor], a), (step, tensor)


def gpu_or_skip():
    reason = xp_adapter.unavailable(key_for(xp_adapter, "gpu"))
    if reason:
        pytest.skip(reason)


@pytest.mark.gpu
def test_gpu_fast_mode_agrees_with_the_eager_cupy_run():
    gpu_or_skip()
    problem = quick_problem("peaks_mlp")
    eager, _ = trained(problem, "gpu", "float32", "eager", upto=10)
    fast, _ = trained(problem, "gpu", "float32", "fast", upto=10)
    np.testing.assert_allclose(fast, eager, rtol=1e-6, atol=0)


@pytest.mark.gpu
def test_gpu_fast_mode_repeats_bitwise_and_replays_graphs():
    gpu_or_skip()
    problem = quick_problem("peaks_mlp")
    first = trained(problem, "gpu", "float32", "fast")
    assert np.isfinite(first[0]).all() and first[0][-1] < first[0][0]
    assert_bitwise(trained(problem, "gpu", "float32", "fast"), first)
    trainer = trainer_of(xp_adapter, problem, "gpu", "float32", "fast")
    xp_adapter.warm_up(trainer, runner.chunk_plan(problem))
    graphs = [ws.graph is not None for ws in trainer.fast.spaces.values()]
    if trainer.fast.graphs_refused:  # CuPy refused the capture (cuBLAS in the step): no graph, and why
        assert "cuBLAS" in trainer.fast.graphs_refused and not any(graphs)
    else:
        assert all(graphs)


# 300 steps: the oracle keeps anchor states. Moons on 250 of its quick profile's 1,000 points:
# the same paths, a quarter of the time (59 s to about 15 s on the 2-core VM).
SHORT = {"peaks_mlp": {"training": {"epochs": 300}}, "moons_net": {"training": {"epochs": 300}, "data": {"n_samples": 250}}}


@pytest.mark.parametrize("spec_name", ["peaks_mlp", "moons_net"])
def test_the_harness_own_runs_take_the_allocation_free_path_bitwise(spec_name, monkeypatch):
    """The oracle (with its anchor states) and the calibration members (float32 and float64)
    train their plain steps on the allocation-free path, after their jittered steps: the
    same bits as all-eager, Adam's moments (peaks) and plain SGD (moons)."""
    from harness.core.paths import SPECS_DIR
    from harness.core.registry import ORACLE_KEY
    from harness.inputs.members import reordered
    from harness.inputs.problem import build_problem
    from harness.spec.load import load_spec

    problem = build_problem(load_spec(SPECS_DIR / f"{spec_name}.yaml", "quick", SHORT[spec_name]))
    assert problem.anchors, "the oracle keeps anchor states on this problem"
    runs = [
        (problem, ORACLE_KEY),
        (reordered(problem, 1), RunKey("numpy", "cpu", "order1")),
        (reordered(problem, 2), RunKey("oracle", "cpu", "order2")),
    ]
    if problem.spec.optimizer.kind == "adam":  # a member computing optax's float32 bias corrections
        optax_like = replace(reordered(problem, 3), float32_corrections=True)
        runs.append((optax_like, RunKey("numpy", "cpu", "as-jax-order3")))
    original = xp_adapter.plain_steps_fast
    for p, key in runs:
        assert original(p, key)
        monkeypatch.setattr(xp_adapter, "plain_steps_fast", original)
        hybrid = runner.run(p, key)
        monkeypatch.setattr(xp_adapter, "plain_steps_fast", lambda problem, key: False)
        eager = runner.run(p, key)
        assert hybrid.status == eager.status == "ok"
        assert np.array_equal(hybrid.losses, eager.losses), key.label
        for name, a in eager.final_params.items():
            assert np.array_equal(hybrid.final_params[name], a), (key.label, name)
        assert hybrid.anchor_states.keys() == eager.anchor_states.keys()
        for step, state in eager.anchor_states.items():
            assert all(np.array_equal(hybrid.anchor_states[step][n], a) for n, a in state.items()), (key.label, step)
    # a framework's own eager run, timed as the article's code, stays eager
    assert not original(problem, RunKey("numpy", "cpu")) and not original(problem, RunKey("numpy", "cpu", precision="float64"))
