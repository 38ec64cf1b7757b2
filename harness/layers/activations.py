"""A layer's activation, its derivative and the cost of each, in the array-module code.

`gelu` is the exact form, z * Phi(z) with the error function (torch's nn.GELU() default,
flax's nn.gelu(approximate=False)); `gelu_tanh` is the tanh approximation (jax.nn.gelu's and
flax's default, torch's nn.GELU(approximate="tanh")). They differ by about 5e-4 per element.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from harness.core.threads import unary
from harness.layers.base import plain

Array = Any
Activation = Literal["relu", "tanh", "identity", "gelu", "gelu_tanh"]

SQRT_2_OVER_PI = math.sqrt(2 / math.pi)
GELU_TANH_CUBIC = 0.044715
# How far the libraries' tanh lands from the exact value, in units in the last place, at
# most (measured on 5,000 points in [-8, 8] against mpmath, float64 and float32: XLA's up to
# 4 ulps, mean 0.68; NumPy's and torch's up to 1): a calibration member rounds tanh's values
# that much otherwise, or it would be closer to the oracle than JAX's honest twin is.
TANH_ULPS = 4.0
# Elementwise operations per value, forward and derivative: the floor's counts.
ELEMENTWISE = {"relu": 1, "tanh": 1, "identity": 0, "gelu": 5, "gelu_tanh": 8}
# relu: z > 0 mask times the gradient; tanh: (1 - a*a) * g
DERIVATIVE = {"relu": 1, "tanh": 3, "identity": 0, "gelu": 9, "gelu_tanh": 13}


def erf(xp):
    """The error function of the array module: SciPy's for NumPy, CuPy's own for CuPy."""
    if xp.__name__ == "numpy":
        from scipy.special import erf as found
    else:
        from cupyx.scipy.special import erf as found
    return found


def activate(xp, z: Array, name: str, jitter=plain) -> Array:
    """act(z); `jitter` rounds the error function's or tanh's values once more in a GELU
    (a calibration member's, harness.reference.network.jitter_function): 1 + erf(z) cancels
    for negative z, where two libraries' GELUs differ by thousands of ulps of the result
    (float32, measured: torch against the exact value up to 8,700 ulps, SciPy's erf 440,
    XLA's 17), so the members must round the term before the cancellation, not only the
    result."""
    if name == "relu":
        return xp.maximum(z, 0)
    if name == "tanh":
        return jitter(unary(xp, xp.tanh, z), TANH_ULPS)
    if name == "gelu":
        return 0.5 * z * (1 + jitter(unary(xp, erf(xp), z / math.sqrt(2))))
    if name == "gelu_tanh":
        return 0.5 * z * (1 + jitter(unary(xp, xp.tanh, SQRT_2_OVER_PI * (z + GELU_TANH_CUBIC * z * z * z)), TANH_ULPS))
    return z


def activation_grad(xp, z: Array, a: Array, name: str, jitter=plain) -> Array:
    """d act / d z, from the pre-activation z and the activation a = act(z); `jitter` as
    in activate."""
    if name == "relu":
        return (z > 0).astype(z.dtype)
    if name == "tanh":
        return 1 - a * a
    if name == "gelu":
        cdf = 0.5 * (1 + jitter(unary(xp, erf(xp), z / math.sqrt(2))))
        return cdf + z * unary(xp, xp.exp, -0.5 * z * z) / math.sqrt(2 * math.pi)
    if name == "gelu_tanh":
        t = jitter(unary(xp, xp.tanh, SQRT_2_OVER_PI * (z + GELU_TANH_CUBIC * z * z * z)), TANH_ULPS)
        return 0.5 * (1 + t) + 0.5 * z * (1 - t * t) * SQRT_2_OVER_PI * (1 + 3 * GELU_TANH_CUBIC * z * z)
    return xp.ones_like(z)
