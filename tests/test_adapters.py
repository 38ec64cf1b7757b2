"""Each adapter against the float64 oracle after one step, with the spec's own tolerances;
and the protocol's promises (warm-up changes nothing, unavailable is a reason)."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

from harness.core import registry
from tests.conftest import CPU_FRAMEWORKS, GPU_FRAMEWORKS, UNIT_TOLERANCES, first_loss, key_for, one_step, quick_problem, trainer_of

SPECS = ["peaks_mlp", "moons_net", "mnist_mlp"]


def adapter_or_skip(name: str, device: str = "cpu"):
    module = registry.load(name)
    reason = module.unavailable(key_for(module, device))
    if reason:
        pytest.skip(reason)
    return module


@pytest.mark.parametrize("spec_name", SPECS)
@pytest.mark.parametrize("framework", CPU_FRAMEWORKS)
def test_adapter_matches_oracle_after_one_step(framework, spec_name, oracle_step):
    adapter = adapter_or_skip(framework)
    problem, (ref_out, ref_loss, ref_params) = oracle_step(spec_name)
    outputs, loss, params = one_step(adapter, problem, "float32")
    checks = UNIT_TOLERANCES
    tol = checks.initial_outputs
    np.testing.assert_allclose(outputs, ref_out, rtol=tol.rtol, atol=tol.atol)
    assert loss == pytest.approx(ref_loss, rel=checks.initial_loss.rtol)
    tol = checks.params_after_first_step
    for (w, b), (rw, rb) in zip(params, ref_params):
        assert w.shape == rw.shape and b.shape == rb.shape
        np.testing.assert_allclose(w, rw, rtol=tol.rtol, atol=tol.atol)
        np.testing.assert_allclose(b, rb, rtol=tol.rtol, atol=tol.atol)
    moved = any(not np.array_equal(w, w0) for (w, _), (w0, _) in zip(params, problem.initial_params))
    assert moved, "one step left every weight where it was"


@pytest.mark.parametrize("framework", CPU_FRAMEWORKS)
def test_warm_up_leaves_the_state_alone(framework):
    adapter = adapter_or_skip(framework)
    problem = quick_problem("peaks_mlp")
    trainer = trainer_of(adapter, problem, "cpu", "float32")
    before = adapter.state(trainer, 0).params
    adapter.warm_up(trainer)
    adapter.synchronize(trainer)
    for (w, b), (w0, b0) in zip(adapter.state(trainer, 0).params, before):
        assert np.array_equal(w, w0) and np.array_equal(b, b0)
    first = first_loss(adapter, trainer)
    again = trainer_of(adapter, problem, "cpu", "float32")
    assert first_loss(adapter, again) == first


def test_jax_compiles_nothing_inside_the_timed_loop():
    """After warm_up the jitted step's cache is complete: the first steps' outputs (committed
    device arrays) hit it. optax's uncommitted step count once made step 2 compile again,
    0.36 s counted as training."""
    adapter = adapter_or_skip("jax")
    for name in ("peaks_mlp", "moons_net"):
        problem = quick_problem(name)
        trainer = trainer_of(adapter, problem, "cpu", "float32")
        adapter.warm_up(trainer)
        compiled = trainer.train_step._cache_size()
        for t in range(3):
            adapter.train(trainer, t, t + 1)
        adapter.synchronize(trainer)
        assert trainer.train_step._cache_size() == compiled


@pytest.mark.parametrize("framework", CPU_FRAMEWORKS)
def test_describe_records_the_math_mode(framework):
    adapter = adapter_or_skip(framework)
    info = adapter.describe(key_for(adapter, "cpu"))
    assert info["version"] and info["math_mode"] and "device_name" in info


def test_no_gpu_is_a_reason_not_a_crash():
    for framework in GPU_FRAMEWORKS:
        try:
            module = registry.load(framework)
        except ImportError:
            continue
        reason = module.unavailable(key_for(module, "gpu"))
        assert reason is None or isinstance(reason, str) and reason


@pytest.mark.gpu
@pytest.mark.parametrize("framework", GPU_FRAMEWORKS)
def test_gpu_adapter_matches_oracle_after_one_step(framework, oracle_step):
    adapter = adapter_or_skip(framework, "gpu")
    problem, (ref_out, ref_loss, ref_params) = oracle_step("moons_net")
    trainer = trainer_of(adapter, problem, "gpu", "float32")
    adapter.warm_up(trainer)
    tol = UNIT_TOLERANCES.initial_outputs
    np.testing.assert_allclose(adapter.predict(trainer, problem.probe), ref_out, rtol=tol.rtol, atol=tol.atol)
    loss = first_loss(adapter, trainer)
    assert loss == pytest.approx(ref_loss, rel=UNIT_TOLERANCES.initial_loss.rtol)
    tol = UNIT_TOLERANCES.params_after_first_step
    for (w, b), (rw, rb) in zip(adapter.state(trainer, 0).params, ref_params):
        np.testing.assert_allclose(w, rw, rtol=tol.rtol, atol=tol.atol)
        np.testing.assert_allclose(b, rb, rtol=tol.rtol, atol=tol.atol)


@pytest.mark.parametrize("name", sorted(registry.ADAPTERS))
def test_every_adapter_satisfies_the_protocol(name):
    """Each registered adapter module has every function of adapters.protocol.Adapter, with
    the same parameters in the same order and the same defaults (imports no framework)."""
    import inspect

    from adapters.protocol import Adapter, MeasuresRates

    module = importlib.import_module(registry.ADAPTERS[name])
    assert isinstance(module, Adapter)
    for member, expected in inspect.getmembers(Adapter, inspect.isfunction):
        if member.startswith("_"):
            continue
        wanted = [(p.name, p.default) for p in list(inspect.signature(expected).parameters.values())[1:]]
        got = [(p.name, p.default) for p in inspect.signature(getattr(module, member)).parameters.values()]
        assert got == wanted, f"{name}.{member}{inspect.signature(getattr(module, member))}"
    if hasattr(module, "rates"):  # optional
        wanted = [p.name for p in list(inspect.signature(MeasuresRates.rates).parameters.values())[1:]]
        assert list(inspect.signature(module.rates).parameters) == wanted
    assert module.NAME in (name, "xp")  # xp: the array-module code, NumPy's and CuPy's


def test_each_run_key_brings_its_own_precision_no_module_global():
    """Precision is an argument: two keys in one process, one after the other, each get the
    math mode they name (the last one, strict, leaves the process as the other tests expect)."""
    for name in CPU_FRAMEWORKS:
        module = registry.load(name)
        assert not hasattr(module, "configure") and not hasattr(module, "_PRECISION"), name
    torch = adapter_or_skip("torch")
    assert torch.describe(registry.RunKey("torch", "cpu", precision="tf32"))["math_mode"]["float32_matmul_precision"] == "high"
    assert torch.describe(registry.RunKey("torch", "cpu"))["math_mode"]["float32_matmul_precision"] == "highest"
    jax = adapter_or_skip("jax")
    assert jax.describe(registry.RunKey("jax", "cpu", precision="float64"))["math_mode"]["jax_enable_x64"] is True
    assert jax.describe(registry.RunKey("jax", "cpu"))["math_mode"]["jax_enable_x64"] is False
