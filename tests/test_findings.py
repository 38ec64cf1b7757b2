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
