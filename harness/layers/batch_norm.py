"""`batch_norm`: each channel (of an image) or feature (of a vector) normalised by the
batch's mean and biased variance in training, by the running statistics in evaluation,
then scaled and shifted.

`momentum` is torch's: running = (1 - m) * running + m * batch (flax's `momentum` is 1 - m,
and defaults to 0.99). `running_var` says which variance is stored: torch stores the
unbiased one (n / (n - 1) times the biased), flax the biased one."""

from __future__ import annotations

from typing import Literal

import numpy as np

from harness.core.strict import Strict
from harness.layers.base import Context, Cost, Shape, features
from harness.layers.sizes import Eps

KIND = "batch_norm"
PREFIX = "bn"
TENSORS = ("scale", "bias", "running_mean", "running_var")
BUFFERS = ("running_mean", "running_var")


class Section(Strict):
    kind: Literal["batch_norm"]
    momentum: float = 0.1
    eps: Eps = 1e-5
    running_var: Literal["unbiased", "biased"] = "unbiased"


def out_shape(section: Section, shape: Shape) -> Shape:
    if not 0 <= section.momentum <= 1:
        raise ValueError(f"batch_norm: momentum {section.momentum} is not in [0, 1] (torch's convention)")
    return shape


def init(section, shape, rng, scheme) -> dict[str, np.ndarray]:
    c = shape[0]
    return {"scale": np.ones(c), "bias": np.zeros(c), "running_mean": np.zeros(c), "running_var": np.ones(c)}


def cost(section: Section, shape: Shape, first: bool) -> Cost:
    values = features(shape)
    return Cost(flops=20 * values, values=values, params=2 * shape[0], launches=6)


def _axes(x) -> tuple[int, ...]:
    return (0, 2, 3) if x.ndim == 4 else (0,)


def _channel(a, x):
    """A per-channel vector broadcast against x."""
    return a.reshape(1, -1, 1, 1) if x.ndim == 4 else a


def forward(xp, section: Section, p: dict, x, ctx: Context):
    jitter = ctx.jitter
    if not ctx.train:
        mean, var = p["running_mean"], p["running_var"]
        x_hat = (x - _channel(mean, x)) / _channel(xp.sqrt(var + section.eps), x)
        return _channel(p["scale"], x) * x_hat + _channel(p["bias"], x), None
    axes = _axes(x)
    count = x.size // x.shape[1]
    mean = jitter(ctx.mean(xp, x, axes))
    centred = x - _channel(mean, x)
    var = jitter(ctx.mean(xp, centred * centred, axes))
    inv = 1 / xp.sqrt(var + section.eps)
    x_hat = jitter(centred * _channel(inv, x))
    stored = var * (count / (count - 1)) if section.running_var == "unbiased" and count > 1 else var
    m = section.momentum
    ctx.updates["running_mean"] = (1 - m) * p["running_mean"] + m * mean
    ctx.updates["running_var"] = (1 - m) * p["running_var"] + m * stored
    return _channel(p["scale"], x) * x_hat + _channel(p["bias"], x), (x_hat, inv)


def backward(xp, section: Section, p: dict, cache, d_y, ctx: Context, need_dx: bool):
    jitter = ctx.jitter
    x_hat, inv = cache
    axes = _axes(d_y)
    grads = {"scale": jitter(ctx.sum(xp, d_y * x_hat, axes)), "bias": jitter(ctx.sum(xp, d_y, axes))}
    if not need_dx:
        return None, grads
    d_hat = d_y * _channel(p["scale"], d_y)
    mean_d = ctx.mean(xp, d_hat, axes)
    mean_dx = ctx.mean(xp, d_hat * x_hat, axes)
    d_x = _channel(inv, d_y) * (d_hat - _channel(mean_d, d_y) - x_hat * _channel(mean_dx, d_y))
    return jitter(d_x), grads
