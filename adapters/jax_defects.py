"""Library defects a JAX float32 training step meets, measured on the run's own device
(harness/library_defects.yaml): where a catalogued defect's trigger is in the step, the
op is computed again alone, on random operands of its shapes, in float32 and in float64,
and reported where the two differ beyond any rounding.

- `xla-cpu-conv-negative-low-padding`: a float32 `conv_general_dilated` with a negative
  low padding (a crop; the backward pass of a convolution whose padding on a side exceeds
  its kernel minus one) reads outside its input in XLA:CPU's Eigen kernel
  (openxla/xla#48713). The same convolution in float64 takes another path and is right.
"""

from __future__ import annotations

from typing import Any

import numpy as np

NEGATIVE_LOW_PADDING = "xla-cpu-conv-negative-low-padding"
# How far a float32 op may sit from its float64 value, relative to that value's largest
# magnitude, and still be rounding: a convolution's float32 sums are within about 1e-6 of
# it (a few hundred terms); the defect puts them 0.3 to 1e35 off (docs/measurements.md).
WRONG = 1e-3


def _convolutions(jaxpr, found: list) -> list:
    """Every conv_general_dilated of a jaxpr, inner jaxprs (jit, custom derivatives, loops) too."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "conv_general_dilated":
            found.append(eqn)
        for value in eqn.params.values():
            for inner in value if isinstance(value, (tuple, list)) else (value,):
                inner = getattr(inner, "jaxpr", inner)  # a ClosedJaxpr's own jaxpr
                if hasattr(inner, "eqns"):
                    _convolutions(inner, found)
    return found


def _alone(eqn, operands: list[np.ndarray], device) -> np.ndarray:
    """The op computed alone, jitted, on `operands` (in their own dtype)."""
    import jax

    params = dict(eqn.params)
    if params.get("preferred_element_type") is not None:
        params["preferred_element_type"] = operands[0].dtype
    placed = [jax.device_put(o, device) for o in operands]
    return np.asarray(jax.jit(lambda *a: eqn.primitive.bind(*a, **params))(*placed), dtype=np.float64)


def _where(eqn) -> str:
    """The op's place in the user's model: its modules' names, and whether it is a backward pass."""
    stack = str(eqn.source_info.name_stack)
    module = stack.rsplit(")", 1)[-1].strip("/") or stack
    return f"{module}'s backward pass" if stack.startswith("transpose(") else module


def measured(step, args: tuple, kwargs: dict, device) -> list[dict[str, Any]]:
    """The catalogued defects the jitted `step` meets on `device`, traced at `args` (after a
    warm-up, jit's cache holds the trace): one entry per defective op, with the defect's id,
    where the op is, its padding and how far its float32 value is from its float64 one
    (relative to the latter's largest magnitude; inf where it is not finite)."""
    import jax

    jaxpr = step.trace(*args, **kwargs).jaxpr.jaxpr
    suspects = [
        e for e in _convolutions(jaxpr, []) if any(low < 0 for low, _ in e.params["padding"]) and all(v.aval.dtype == np.float32 for v in e.invars)
    ]
    found = []
    rng = np.random.default_rng(0)
    for eqn in suspects:
        operands = [rng.standard_normal(v.aval.shape) for v in eqn.invars]
        got = _alone(eqn, [o.astype(np.float32) for o in operands], device)
        with jax.enable_x64(True):
            want = _alone(eqn, operands, device)
        scale = float(np.abs(want).max()) or 1.0
        error = float(np.abs(got - want).max()) / scale if np.isfinite(got).all() else float("inf")
        if not error <= WRONG:
            padding = [list(p) for p in eqn.params["padding"]]
            found.append({"defect": NEGATIVE_LOW_PADDING, "op": _where(eqn), "padding": padding, "error": error})
    return found
