"""The JAX adapter's fast mode (the step in a compiled loop over many steps): the same
numbers as the eager mode, bit for bit on the CPU, with everything compiled in warm-up."""

from __future__ import annotations

import numpy as np
import pytest

from harness.core.registry import RunKey
from harness.run.runner import chunk_plan, run
from tests.conftest import problem_or_skip, quick_problem, trainer_of

pytest.importorskip("flax")
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
    assert set(fast.snapshots) == set(eager.snapshots)
    compared = [*((eager.snapshots[step], fast.snapshots[step]) for step in eager.snapshots), (eager.final_params, fast.final_params)]
    for params_e, params_f in compared:
        assert list(params_f) == list(params_e)
        for tensor, a in params_e.items():
            np.testing.assert_array_equal(params_f[tensor], a, err_msg=tensor)


def test_fast_mode_compiles_in_warm_up_only_and_leaves_the_state_alone(mnist_dir):
    from adapters import jax_adapter as adapter

    problem = quick_problem("mnist_mlp", mnist_dir)  # two batch sizes: runs of 128-row steps and 64-row steps
    plan = chunk_plan(problem)
    trainer = trainer_of(adapter, problem, "cpu", "float32", "fast")
    before = adapter.state(trainer, 0).params
    adapter.warm_up(trainer, plan)
    after = adapter.state(trainer, 0).params
    assert list(after) == list(before)
    for tensor, a in before.items():
        np.testing.assert_array_equal(after[tensor], a, err_msg=tensor)
    compiled = dict(trainer.compiled)
    assert {size for _, size in compiled} == {stop - start for start, stop in problem.bounds}

    def no_compiling(*args):
        raise AssertionError(f"compiled inside train: {args}")

    trainer.run_of_steps = no_compiling
    for start, stop in plan:
        adapter.train(trainer, start, stop)
    adapter.synchronize(trainer)
    assert trainer.compiled == compiled
    assert np.isfinite(adapter.state(trainer, problem.total_steps).losses).all()


def test_cross_entropy_has_optax_values_and_no_gather_or_scatter():
    """The JAX loss for integer labels gives optax's values bit for bit, and neither it nor
    its gradient holds a gather or a scatter: under --xla_gpu_deterministic_ops XLA runs a
    scatter-add as a serial loop over the examples."""
    import jax
    import optax

    from adapters import jax_adapter

    rng = np.random.default_rng(7)
    logits = jax.numpy.asarray(rng.normal(0, 3, (257, 10)).astype(np.float32))
    labels = jax.numpy.asarray(rng.integers(0, 10, 257).astype(np.int32))
    ours = jax_adapter.cross_entropy(logits, labels)
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(optax.softmax_cross_entropy_with_integer_labels(logits, labels)))

    def grad_of(fn):
        return jax.grad(lambda z: fn(z, labels).mean())

    ours_grad, optax_grad = grad_of(jax_adapter.cross_entropy)(logits), grad_of(optax.softmax_cross_entropy_with_integer_labels)(logits)
    np.testing.assert_allclose(np.asarray(ours_grad), np.asarray(optax_grad), rtol=0, atol=1e-7 / 257)
    program = str(jax.make_jaxpr(grad_of(jax_adapter.cross_entropy))(logits))
    assert "gather" not in program and "scatter" not in program, program
    assert "scatter" in str(jax.make_jaxpr(grad_of(optax.softmax_cross_entropy_with_integer_labels))(logits))
