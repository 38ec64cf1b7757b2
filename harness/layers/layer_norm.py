"""`layer_norm`: each example's features normalised by their own mean and biased variance,
eps inside the square root (torch's default eps is 1e-5, flax's 1e-6), then scaled and
shifted per feature. It takes a vector (put a flatten before it on an image), or a text's
(positions, width) values, each position normalised on its own."""

from __future__ import annotations

from typing import Literal

import numpy as np

from harness.core.strict import Strict
from harness.layers.base import Context, Cost, Shape
from harness.layers.sizes import Eps

KIND = "layer_norm"
PREFIX = "ln"
TENSORS = ("scale", "bias")
BUFFERS: tuple[str, ...] = ()


class Section(Strict):
    kind: Literal["layer_norm"]
    eps: Eps = 1e-5


def out_shape(section: Section, shape: Shape) -> Shape:
    if len(shape) not in (1, 2):
        raise ValueError(f"layer_norm takes a vector, not an image of shape {list(shape)}: put a flatten before it")
    return shape


def init(section, shape, rng, scheme) -> dict[str, np.ndarray]:
    return {"scale": np.ones(shape[-1]), "bias": np.zeros(shape[-1])}


def cost(section: Section, shape: Shape, first: bool) -> Cost:
    values = shape[0] * shape[-1] if len(shape) == 2 else shape[0]
    return Cost(flops=20 * values, values=values, params=2 * shape[-1], launches=6)


def forward(xp, section: Section, p: dict, x, ctx: Context):
    if x.ndim == 3:  # (batch, positions, width): every position a row
        out, cache = forward(xp, section, p, x.reshape(-1, x.shape[-1]), ctx)
        return out.reshape(x.shape), cache
    jitter = ctx.jitter
    mean = jitter(ctx.mean(xp, x, (1,))[:, None])
    centred = x - mean
    var = jitter(ctx.mean(xp, centred * centred, (1,))[:, None])
    inv = 1 / xp.sqrt(var + section.eps)
    x_hat = jitter(centred * inv)
    return p["scale"] * x_hat + p["bias"], (x_hat, inv)


def backward(xp, section: Section, p: dict, cache, d_y, ctx: Context, need_dx: bool):
    if d_y.ndim == 3:
        d_x, grads = backward(xp, section, p, cache, d_y.reshape(-1, d_y.shape[-1]), ctx, need_dx)
        return (None if d_x is None else d_x.reshape(d_y.shape)), grads
    jitter = ctx.jitter
    x_hat, inv = cache
    grads = {"scale": jitter(ctx.total(xp, d_y * x_hat, 0)), "bias": jitter(ctx.total(xp, d_y, 0))}
    if not need_dx:
        return None, grads
    d_hat = d_y * p["scale"]
    d_x = inv * (d_hat - ctx.mean(xp, d_hat, (1,))[:, None] - x_hat * ctx.mean(xp, d_hat * x_hat, (1,))[:, None])
    return jitter(d_x), grads
