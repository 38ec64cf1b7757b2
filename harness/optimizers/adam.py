"""`adam`: Kingma and Ba's update (Flux, torch.optim and optax agree): both moments
bias-corrected, eps added to sqrt(v_hat); weight_decay is coupled (added to the gradient),
as torch.optim.Adam's."""

from __future__ import annotations

from typing import ClassVar, Literal

import numpy as np

from harness.layers.base import plain
from harness.optimizers.recipe import Beta, Rate, Recipe

KIND = "adam"


class Adam(Recipe):
    """Adam as in Kingma & Ba: eps is added to sqrt(v_hat), both moments bias-corrected.
    weight_decay is coupled (added to the gradient), as torch.optim.Adam's. beta1, beta2 and
    eps default to the values torch.optim.Adam and optax.adam share (0.9, 0.999, 1e-8)."""

    kind: Literal["adam"]
    beta1: Beta = 0.9
    beta2: Beta = 0.999
    eps: Rate = 1e-8

    fast_rule: ClassVar[bool] = True


Section = Adam


def cost(opt: Adam) -> tuple[int, int]:
    """Float operations and state arrays per parameter, besides the parameter: the two
    moments, their corrections, the square root, eps and the update."""
    return 12, 2


def init(xp, opt: Adam, params, names: list[str]):
    """The update count, and both moments at zero."""
    return {"t": 0, "m": {n: xp.zeros_like(params[n]) for n in names}, "v": {n: xp.zeros_like(params[n]) for n in names}}


def state_at(opt: Adam, step: int, moments):
    """The state after `step` updates, from a training state's moments (`m` and `v`)."""
    return {"t": step, "m": dict(moments["m"]), "v": dict(moments["v"])}


def bias_corrections(opt: Adam, t: int) -> tuple[float, float]:
    """1 - beta1^t and 1 - beta2^t, in Python floats (as torch.optim computes them)."""
    return 1 - opt.beta1**t, 1 - opt.beta2**t


def float32_bias_corrections(opt: Adam, t: int) -> tuple[float, float]:
    """1 - beta^t as optax computes it: in float32, with beta rounded to float32
    (harness/known_differences.yaml, optax-adam-float32-bias-corrections)."""
    one = np.float32(1)
    return float(one - np.float32(opt.beta1) ** np.float32(t)), float(one - np.float32(opt.beta2) ** np.float32(t))


def denominator(xp, v_hat, eps: float):
    return xp.sqrt(v_hat) + eps


def update(xp, params, grads, state, opt: Adam, lr: float, jitter=plain, corrections=None, denominator=denominator):
    """Adam at rate `lr`; AdamW (opt.coupled_decay false) first shrinks the parameters by
    lr * weight_decay (decoupled).

    `corrections` (bias_corrections by default) and `denominator` are the definition's two
    places where implementations differ; tests swap them to reproduce such differences.
    """
    corrections = bias_corrections if corrections is None else corrections
    t = state["t"] + 1
    c1, c2 = corrections(opt, t)
    decoupled = opt.weight_decay if not opt.coupled_decay else 0.0
    new_params, new_m, new_v = dict(params), {}, {}
    for name, g in grads.items():
        p = params[name]
        if decoupled:
            p = jitter(p * (1 - lr * decoupled))
        m = jitter(opt.beta1 * state["m"][name] + (1 - opt.beta1) * g)
        v = jitter(opt.beta2 * state["v"][name] + (1 - opt.beta2) * (g * g))
        new_params[name] = p - jitter(lr * (m / c1) / denominator(xp, v / c2, opt.eps))
        new_m[name], new_v[name] = m, v
    return new_params, {"t": t, "m": new_m, "v": new_v}
