"""Evidence for the explanations the specs give under known_differences."""

from __future__ import annotations

import numpy as np
import pytest

from adapters import xp_mlp
from harness import runner
from harness.registry import ORACLE_KEY, RunKey
from tests.conftest import quick_problem

STEPS = 40


def adam_float32_bias_correction(xp, params, grads, state, opt):
    """xp_mlp.adam_update, but with 1 - beta^t computed as optax does: in float32."""
    t = state["t"] + 1
    one = np.float32(1)
    c1 = one - np.float32(opt.beta1) ** np.float32(t)
    c2 = one - np.float32(opt.beta2) ** np.float32(t)
    new_params, new_state = [], {"t": t, "m": [], "v": []}
    for p_pair, g_pair, m_pair, v_pair in zip(params, grads, state["m"], state["v"]):
        ms = [opt.beta1 * m + (1 - opt.beta1) * g for m, g in zip(m_pair, g_pair)]
        vs = [opt.beta2 * v + (1 - opt.beta2) * (g * g) for v, g in zip(v_pair, g_pair)]
        new_params.append(tuple(p - opt.lr * (m / c1) / (xp.sqrt(v / c2) + opt.eps) for p, m, v in zip(p_pair, ms, vs)))
        new_state["m"].append(tuple(ms))
        new_state["v"].append(tuple(vs))
    return new_params, new_state


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
    monkeypatch.setattr(xp_mlp, "adam_update", adam_float32_bias_correction)
    like_optax = early_curve(problem, RunKey("cupy", "cpu"))

    def rel(a, b):
        return float(np.max(np.abs(a - b) / np.abs(b)))

    # JAX leaves the oracle more than ten times faster than float32 rounding alone does ...
    assert rel(jax_curve, oracle) > 10 * rel(reference32, oracle)
    # ... and the same array-module code, given optax's float32 bias correction, follows JAX
    # at the level of float32 rounding.
    assert rel(like_optax, jax_curve) < 0.1 * rel(jax_curve, oracle)
    assert rel(like_optax, jax_curve) < 1e-6
