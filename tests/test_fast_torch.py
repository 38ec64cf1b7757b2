"""The torch adapter's fast mode: the eager training, compiled (CPU) or captured in CUDA
graphs (GPU). Checked against the float64 oracle and the eager run with each spec's own
tolerances, and for what makes its timings fair: warm_up leaves the state as built, and
train compiles nothing."""

from __future__ import annotations

import functools

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from adapters import torch_fast  # noqa: E402
from harness.core import registry  # noqa: E402
from harness.core.paths import SPECS_DIR  # noqa: E402
from harness.core.registry import RunKey  # noqa: E402
from harness.inputs import problem as inputs  # noqa: E402
from harness.optimizers import adam  # noqa: E402
from harness.run import runner  # noqa: E402
from harness.spec.load import load_spec  # noqa: E402
from tests.conftest import UNIT_TOLERANCES, key_for, problem_or_skip, quick_problem, trainer_of  # noqa: E402

SPECS = ["peaks_mlp", "moons_net", "mnist_mlp"]
CURVE_STEPS = 40


@pytest.fixture(scope="module")
def adapter():
    module = registry.load("torch")
    return module


def minibatch_problem():
    """moons in shuffled minibatches of 96: 10 full batches and one of 40 an epoch, so two
    batch sizes (two compiled graphs, two CUDA graphs) without the MNIST files."""
    extra = {
        "training": {"batch_size": 96, "shuffle": True, "epochs": 3},
        "checks": {"params_after_steps": {"step": 10}},
    }
    return inputs.build_problem(load_spec(SPECS_DIR / "moons_net.yaml", "quick", extra=extra))


def trained(adapter, problem, mode: str, steps: int, device: str = "cpu", warm: bool = True):
    trainer = trainer_of(adapter, problem, device, "float32", mode)
    if warm:
        adapter.warm_up(trainer, [(0, steps)])
    adapter.train(trainer, 0, steps)
    return trainer


def rel(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b)) / np.abs(b)))


def assert_params_close(params, ref_params, tol):
    assert list(params) == list(ref_params)
    for name, ref in ref_params.items():
        assert params[name].shape == ref.shape, name
        np.testing.assert_allclose(params[name], ref, rtol=tol.rtol, atol=tol.atol, err_msg=name)


def dynamo_counters() -> dict:
    """Every compile (a dynamo frame, an AOTAutograd graph, an inductor graph, the lazily
    compiled backward included) moves one of these; running a compiled graph moves none."""
    from torch._dynamo.utils import counters

    return {kind: dict(values) for kind, values in counters.items()}


@pytest.mark.parametrize("spec_name", SPECS)
def test_fast_cpu_matches_the_oracle_after_one_step(adapter, spec_name, oracle_step):
    problem, (_, ref_loss, ref_params) = oracle_step(spec_name)
    trainer = trainer_of(adapter, problem, "cpu", "float32", "fast")
    adapter.warm_up(trainer, runner.chunk_plan(problem))
    adapter.train(trainer, 0, 1)
    checks = UNIT_TOLERANCES
    assert adapter.state(trainer, 1).losses[0] == pytest.approx(ref_loss, rel=checks.initial_loss.rtol)
    params = adapter.state(trainer, 0).params
    assert_params_close(params, ref_params, checks.params_after_first_step)
    assert any(not np.array_equal(params[name], w0) for name, w0 in problem.initial_params.items() if name.endswith(".weight"))


@pytest.mark.parametrize("spec_name", SPECS)
def test_fast_cpu_curve_follows_the_eager_run(adapter, spec_name):
    """Within the spec's curve tolerance for as long as the spec asks it to hold. The fused
    Adam keeps eager's float64 bias corrections, so no explanation is needed (see below)."""
    problem = problem_or_skip(spec_name)
    curve = problem.spec.checks.loss_curve
    steps = min(curve.must_hold_for or CURVE_STEPS, CURVE_STEPS, problem.total_steps)
    eager = adapter.state(trained(adapter, problem, "eager", steps), steps).losses
    fast = adapter.state(trained(adapter, problem, "fast", steps), steps).losses
    assert rel(fast, eager) <= curve.rtol


def float32_bias_corrections(opt, t):
    """1 - beta^t in float32 with beta rounded to float32 (as optax, and compiled torch.optim)."""
    one = np.float32(1)
    return one - np.float32(opt.beta1) ** np.float32(t), one - np.float32(opt.beta2) ** np.float32(t)


def test_compiled_adam_would_take_float32_bias_corrections_the_fused_one_does_not(adapter, monkeypatch):
    """Why the CPU fast mode updates with the fused kernel instead of a torch.compile'd
    torch.optim.Adam: compiled, Adam's step count is a float32 tensor and 1 - beta^t is taken
    in float32 (torch/optim/adam.py: _get_value returns the tensor while compiling), so its
    peaks curve follows the array-module Adam given float32 corrections, not eager torch.
    The fused kernel's curve follows eager torch."""
    problem = quick_problem("peaks_mlp")
    eager = adapter.state(trained(adapter, problem, "eager", CURVE_STEPS), CURVE_STEPS).losses
    fast = adapter.state(trained(adapter, problem, "fast", CURVE_STEPS), CURVE_STEPS).losses

    compiled = trainer_of(adapter, problem, "cpu", "float32", "fast")
    compiled.optimizer = adapter._optimizer(torch, problem.spec, compiled.model)  # the default Adam
    compiled.optimizer.step = torch.compile(compiled.optimizer.step)  # as in the tutorial
    adapter.warm_up(compiled, [(0, CURVE_STEPS)])
    adapter.train(compiled, 0, CURVE_STEPS)
    compiled_adam = adapter.state(compiled, CURVE_STEPS).losses

    original = adam.update

    def reference_curve(**corrections):
        monkeypatch.setattr(adam, "update", functools.partial(original, **corrections))
        outcome = runner.run(problem, RunKey("numpy", "cpu"))
        assert outcome.status == "ok", outcome.reason
        return outcome.losses[:CURVE_STEPS]

    python_corrections = reference_curve()
    float32_corrections = reference_curve(corrections=float32_bias_corrections)
    # the reproduction tells the two apart: its two variants drift apart by ~7e-6 in 40 steps
    assert rel(float32_corrections, python_corrections) > 1e-6
    # compiled Adam follows float32 corrections, ten times closer than it follows eager torch
    assert rel(compiled_adam, float32_corrections) < 0.1 * rel(compiled_adam, eager)
    # the fast mode follows eager torch, ten times closer than float32 corrections do
    assert rel(fast, eager) < 0.1 * rel(float32_corrections, eager)


@pytest.mark.parametrize("which", ["peaks_mlp", "minibatch"])
def test_warm_up_changes_nothing_and_train_compiles_nothing(adapter, which):
    problem = minibatch_problem() if which == "minibatch" else quick_problem(which)
    plan = runner.chunk_plan(problem)
    trainer = trainer_of(adapter, problem, "cpu", "float32", "fast")
    before = adapter.state(trainer, 0).params
    adapter.warm_up(trainer, plan)
    after = adapter.state(trainer, 0).params
    assert list(after) == list(before)
    for name, a0 in before.items():
        assert np.array_equal(after[name], a0), name
    assert all(p.grad is None for p in trainer.model.parameters())
    state = [v for s in trainer.optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    assert not any(v.any() for v in state)  # Adam: step, exp_avg, exp_avg_sq as a new one starts them
    assert not trainer.loss_log.any()

    compiled = dynamo_counters()
    for start, stop in plan:
        adapter.train(trainer, start, stop)
    assert dynamo_counters() == compiled, "train compiled something: warm_up missed a graph"

    # the same bits as a trainer that never warmed up (its graphs are cached by now)
    cold = trained(adapter, problem, "fast", problem.total_steps, warm=False)
    total = problem.total_steps
    assert np.array_equal(adapter.state(trainer, total).losses, adapter.state(cold, total).losses)
    warmed, unwarmed = adapter.state(trainer, 0).params, adapter.state(cold, 0).params
    assert list(warmed) == list(unwarmed)
    for name, a0 in unwarmed.items():
        assert np.array_equal(warmed[name], a0), name


def test_the_gpu_step_body_trains_like_eager_when_run_uncaptured_on_the_cpu(adapter):
    """The CUDA graphs' body (device-side counters, per-batch-size row tables, the loss-log
    slot) run step by step on the CPU, where it can be checked without a GPU."""
    problem = minibatch_problem()
    total = problem.total_steps
    eager = trained(adapter, problem, "eager", total)
    body = trainer_of(adapter, problem, "cpu", "float32", "fast")
    torch_fast.gpu_tables(torch, body)
    sizes = body.fast.sizes
    assert sorted(set(sizes)) == [40, 96]
    for t in range(total):
        torch_fast.gpu_step(torch, body, sizes[t % len(sizes)])
    checks = UNIT_TOLERANCES
    assert rel(adapter.state(body, total).losses, adapter.state(eager, total).losses) <= problem.spec.checks.loss_curve.rtol
    assert_params_close(adapter.state(body, 0).params, adapter.state(eager, 0).params, checks.params_after_steps)
    assert int(body.fast.step_counter) == total

    # seeking to any step points each table's counter at that step's rows
    for t in (0, 5, 10, 11, 21, 32):
        torch_fast.seek(body, t)
        epoch, start, stop = problem.batch_slice(t)
        table, counter = body.fast.tables[stop - start]
        assert np.array_equal(table[int(counter)].numpy(), problem.batch_order[epoch, start:stop])


def test_describe_says_what_the_fast_mode_does(adapter):
    assert "fast_mode" not in adapter.describe(key_for(adapter, "cpu"))
    for device in ("cpu", "gpu"):
        assert adapter.FAST_MODE[device]
    assert adapter.describe(key_for(adapter, "cpu", mode="fast"))["fast_mode"] == adapter.FAST_MODE["cpu"]


def gpu_or_skip(adapter):
    reason = adapter.unavailable(key_for(adapter, "gpu"))
    if reason:
        pytest.skip(reason)


@pytest.mark.gpu
def test_gpu_fast_mode_repeats_bitwise_and_matches_the_oracle_after_one_step(adapter, oracle_step):
    gpu_or_skip(adapter)
    problem, (_, ref_loss, ref_params) = oracle_step("peaks_mlp")
    outcome = runner.run(problem, RunKey("torch", "gpu", mode="fast"), repeats=2)
    assert outcome.status == "ok", outcome.reason
    assert outcome.describe["fast_mode"] == adapter.FAST_MODE["gpu"]
    assert outcome.repeats_bitwise_identical, (outcome.repeats_max_abs_diff, outcome.repeats_first_diff_step)
    checks = UNIT_TOLERANCES
    assert outcome.losses[0] == pytest.approx(ref_loss, rel=checks.initial_loss.rtol)
    assert_params_close(outcome.snapshots[1], ref_params, checks.params_after_first_step)
    eager = runner.run(problem, RunKey("torch", "gpu"))
    assert eager.status == "ok", eager.reason
    steps = problem.spec.checks.loss_curve.must_hold_for
    assert rel(outcome.losses[:steps], eager.losses[:steps]) <= problem.spec.checks.loss_curve.rtol


@pytest.mark.gpu
def test_gpu_fast_minibatches_follow_the_eager_run(adapter):
    """Two batch sizes, two CUDA graphs, the rows picked on the device."""
    gpu_or_skip(adapter)
    problem = minibatch_problem()
    total = problem.total_steps
    fast = trained(adapter, problem, "fast", total, device="gpu")
    eager = trained(adapter, problem, "eager", total, device="gpu")
    checks = UNIT_TOLERANCES
    assert rel(adapter.state(fast, total).losses, adapter.state(eager, total).losses) <= problem.spec.checks.loss_curve.rtol
    assert_params_close(adapter.state(fast, 0).params, adapter.state(eager, 0).params, checks.params_after_steps)


def test_compile_works_where_torch_compile_has_no_recompile_limit_keyword(adapter, monkeypatch):
    """torch 2.11 (the GPU host's) has no `recompile_limit` keyword on torch.compile: the
    adapter must not pass it there, and must raise dynamo's process-wide limit instead."""
    real_compile = torch.compile

    def compile_2_11(model=None, *, fullgraph=False, dynamic=None, backend="inductor", mode=None, options=None, disable=False):
        return real_compile(model, fullgraph=fullgraph, dynamic=dynamic, backend=backend, mode=mode, options=options, disable=disable)

    config = torch._dynamo.config
    monkeypatch.setattr(torch, "compile", compile_2_11)
    monkeypatch.setattr(torch_fast, "_COMPILED", {})  # compile afresh, through the 2.11 signature
    # Not monkeypatch: its undo would delete the attribute, which hides the setting in
    # torch's config module for the rest of the process.
    before = config.recompile_limit
    config.recompile_limit = 8
    try:
        problem = quick_problem("peaks_mlp")
        trainer = trained(adapter, problem, "fast", 3)
        assert np.all(np.isfinite(adapter.state(trainer, 3).losses))
        assert config.recompile_limit == torch_fast.RECOMPILE_LIMIT
    finally:
        config.recompile_limit = before


def test_the_gpu_fast_mode_skips_a_spec_with_dropout_before_touching_the_gpu(adapter):
    """The first GPU contact's smoke failed cnn_norm_mnist torch@gpu:fast with a ValueError;
    a documented limit of the mode is a skipped run (errors.Unsupported) with its reason,
    said before the model is put on a device (so this holds on a CPU-only host too)."""
    from harness.core.errors import Unsupported
    from harness.smoke import smoke_problem

    problem = smoke_problem(load_spec(SPECS_DIR / "cnn_norm_mnist.yaml", "quick").spec)
    assert problem.masks, "cnn_norm_mnist's smoke problem has dropout masks"
    with pytest.raises(Unsupported, match="does not take dropout masks yet; cnn_norm_mnist has dropout"):
        adapter.build(problem, {}, RunKey("torch", "gpu", mode="fast"))
