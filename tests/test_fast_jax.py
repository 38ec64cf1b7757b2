"""The JAX adapter's fast mode (the step in a compiled loop over many steps): the same
numbers as the eager mode, bit for bit on the CPU, with everything compiled in warm-up."""

from __future__ import annotations

import numpy as np
import pytest

from harness.registry import RunKey
from harness.runner import chunk_plan, run
from tests.conftest import problem_or_skip, quick_problem

pytest.importorskip("optax")


@pytest.mark.parametrize("name", ["peaks_mlp", "moons_net", "mnist_mlp"])
def test_fast_mode_gives_the_eager_modes_bits(name):
    """The same update inside a scan compiles to the same arithmetic on XLA's CPU backend:
    curve, snapshots and final parameters are identical (minibatch rows included)."""
    problem = problem_or_skip(name)
    eager = run(problem, RunKey("jax", "cpu"))
    fast = run(problem, RunKey("jax", "cpu", mode="fast"))
    assert eager.status == fast.status == "ok", (eager.reason, fast.reason)
    assert "fast_mode" in fast.describe and "fast_mode" not in eager.describe
    np.testing.assert_array_equal(fast.losses, eager.losses)
    for step in eager.snapshots:
        for (we, be), (wf, bf) in zip(eager.snapshots[step], fast.snapshots[step]):
            np.testing.assert_array_equal(wf, we)
            np.testing.assert_array_equal(bf, be)
    for (we, be), (wf, bf) in zip(eager.final_params, fast.final_params):
        np.testing.assert_array_equal(wf, we)
        np.testing.assert_array_equal(bf, be)


def test_fast_mode_compiles_in_warm_up_only_and_leaves_the_state_alone(mnist_dir):
    from adapters import jax_adapter as adapter

    problem = quick_problem("mnist_mlp", mnist_dir)  # two batch sizes: runs of 128-row steps and 64-row steps
    plan = chunk_plan(problem)
    trainer = adapter.build(problem, adapter.put(problem, "cpu", "float32"), "cpu", "float32", "fast")
    before = adapter.params(trainer)
    adapter.warm_up(trainer, plan)
    for (w0, b0), (w1, b1) in zip(before, adapter.params(trainer)):
        np.testing.assert_array_equal(w1, w0)
        np.testing.assert_array_equal(b1, b0)
    compiled = dict(trainer.compiled)
    assert {size for _, size in compiled} == {stop - start for start, stop in problem.bounds}

    def no_compiling(*args):
        raise AssertionError(f"compiled inside train: {args}")

    trainer.run_of_steps = no_compiling
    for start, stop in plan:
        adapter.train(trainer, start, stop)
    adapter.synchronize(trainer)
    assert trainer.compiled == compiled
    assert np.isfinite(adapter.losses(trainer, problem.total_steps)).all()
