"""`rmsprop`: torch.optim.RMSprop's update (Hinton's, uncentered). With g the gradient after
the recipe, at update t:
    v <- alpha * v + (1 - alpha) * g^2          (v starts at 0)
    d  = g / (sqrt(v) + eps)                      (eps outside the square root)
    with momentum: b <- momentum * b + d (b starts at 0), p <- p - lr_t * b
    else:          p <- p - lr_t * d
The rate multiplies the momentum buffer, not each term going into it. weight_decay is
coupled (added to the gradient), as torch.optim.RMSprop's.

optax expresses it exactly with its own parts, chained in this order:
scale_by_rms(decay=alpha, eps=eps, eps_in_sqrt=False, initial_scale=0), trace(momentum),
scale_by_learning_rate(lr) (adapters/jax_adapter.py). optax.rmsprop's defaults differ in
three places (decay 0.9, eps inside the square root, and the rate applied before the momentum
trace), so `alpha` has no default here: torch's is 0.99 and optax's 0.9."""

from __future__ import annotations

from typing import Literal

from harness.layers.base import plain
from harness.optimizers.recipe import Beta, Decay, Rate, Recipe

KIND = "rmsprop"


class RMSprop(Recipe):
    """RMSprop as torch.optim.RMSprop computes it: eps added to sqrt(v), an optional
    momentum buffer of the scaled gradients, the rate applied to that buffer."""

    kind: Literal["rmsprop"]
    alpha: Beta
    eps: Rate = 1e-8  # torch's default and optax's
    momentum: Decay = 0.0


Section = RMSprop


def cost(opt: RMSprop) -> tuple[int, int]:
    """Float operations and state arrays per parameter, besides the parameter: v's average
    (4), the square root, eps and the division (3), the update (2); the momentum buffer's 2."""
    return (9, 1) if not opt.momentum else (11, 2)


def init(xp, opt: RMSprop, params, names: list[str]):
    """The update count, v at zero, and the momentum buffer at zero (torch.optim's)."""
    state = {"t": 0, "v": {n: xp.zeros_like(params[n]) for n in names}}
    if opt.momentum:
        state["buf"] = {n: xp.zeros_like(params[n]) for n in names}
    return state


def state_at(opt: RMSprop, step: int, moments):
    """The state after `step` updates, from a training state's moments (`v`, and
    `momentum` with a momentum)."""
    state = {"t": step, "v": dict(moments["v"])}
    if opt.momentum:
        state["buf"] = dict(moments["momentum"])
    return state


def update(xp, params, grads, state, opt: RMSprop, lr: float, jitter=plain, corrections=None):
    """torch.optim.RMSprop's update at rate `lr`."""
    if corrections is not None:
        raise ValueError("rmsprop: has no bias corrections to compute as a library does")
    new_params, new_v, new_buf = dict(params), {}, {}
    for name, g in grads.items():
        v = jitter(opt.alpha * state["v"][name] + (1 - opt.alpha) * (g * g))
        scaled = jitter(g / jitter(xp.sqrt(v) + opt.eps))
        if opt.momentum:
            scaled = jitter(opt.momentum * state["buf"][name] + scaled)
            new_buf[name] = scaled
        new_params[name] = params[name] - jitter(lr * scaled)
        new_v[name] = v
    found = {"t": state["t"] + 1, "v": new_v}
    if opt.momentum:
        found["buf"] = new_buf
    return new_params, found
