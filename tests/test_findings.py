"""Evidence for the explanations the specs give under known_differences."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from adapters import xp_mlp
from harness import runner
from harness.registry import ORACLE_KEY, RunKey
from tests.conftest import quick_problem

STEPS = 40


def float32_bias_corrections(opt, t):
    """1 - beta^t computed as optax does: in float32, with beta rounded to float32."""
    one = np.float32(1)
    return one - np.float32(opt.beta1) ** np.float32(t), one - np.float32(opt.beta2) ** np.float32(t)


def early_curve(problem, key):
    outcome = runner.run(problem, key)
    assert outcome.status == "ok", outcome.reason
    return outcome.losses[:STEPS]


def test_optax_float32_bias_correction_explains_the_jax_drift_on_peaks(monkeypatch):
    pytest.importorskip("optax")
    problem = quick_problem("peaks_mlp")
    jax_curve = early_curve(problem, RunKey("jax", "cpu"))
    oracle = early_curve(problem, ORACLE_KEY)
    reference32 = early_curve(problem, RunKey("cupy", "cpu"))
    like_optax_adam = functools.partial(xp_mlp.adam_update, corrections=float32_bias_corrections)
    monkeypatch.setattr(xp_mlp, "adam_update", like_optax_adam)
    like_optax = early_curve(problem, RunKey("cupy", "cpu"))

    def rel(a, b):
        return float(np.max(np.abs(a - b) / np.abs(b)))

    # JAX leaves the oracle more than ten times faster than float32 rounding alone does ...
    assert rel(jax_curve, oracle) > 10 * rel(reference32, oracle)
    # ... and the same array-module code, given optax's float32 bias correction, follows JAX
    # at the level of float32 rounding.
    assert rel(like_optax, jax_curve) < 0.1 * rel(jax_curve, oracle)
    assert rel(like_optax, jax_curve) < 1e-6


def test_inductor_sums_the_moons_cross_entropy_with_fewer_partial_sums():
    """torch.compile's mean of the 5,000 per-example losses is what leaves the envelope on
    moons (fast mode), not the per-example values: those are as accurate as eager torch's."""
    torch = pytest.importorskip("torch")
    from harness.spec import SPECS_DIR, load_spec
    from harness import inputs

    problem = inputs.build_problem(load_spec(SPECS_DIR / "moons_net.yaml", "bench"))  # the full 5,000 points
    (w1, b1), (w2, b2) = problem.initial_params
    x, y = problem.x_train.astype(np.float32), problem.y_train
    outputs = np.tanh(x.astype(np.float64) @ w1 + b1) @ w2 + b2
    per_example64 = -xp_mlp.log_softmax(np, outputs)[np.arange(len(y)), y]
    W1, B1, W2, B2 = (torch.from_numpy(a) for a in (w1, b1, w2, b2))

    def cross_entropy(x, y, reduction):
        return torch.nn.functional.cross_entropy(torch.tanh(x @ W1 + B1) @ W2 + B2, y, reduction=reduction)

    compiled = torch.compile(cross_entropy, dynamic=False)
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)
    per_eager = cross_entropy(tx, ty, "none").numpy()
    per_compiled = compiled(tx, ty, "none").numpy()
    mean64 = per_example64.mean()

    def rel(value):
        return abs(float(value) - mean64) / mean64

    def worst(per_example):
        return float(np.max(np.abs(per_example - per_example64) / per_example64))

    assert worst(per_compiled) <= 2 * worst(per_eager)  # per example, as close to float64 as eager's values ...
    assert rel(per_compiled.astype(np.float64).mean()) < 1e-8  # ... and, summed exactly, they give the mean
    mean_compiled = rel(compiled(tx, ty, "mean"))
    assert mean_compiled > 2 * rel(cross_entropy(tx, ty, "mean"))  # eager torch's own reduction
    assert mean_compiled > 10 * rel(per_compiled.sum(dtype=np.float32) / len(y))  # NumPy's pairwise float32 sum
