"""`dense`: y = act(x W + b), W stored (fan_in, fan_out). The kind of a layer that names none.
On a text's (positions, width) values it acts on the last axis, every position a row."""

from __future__ import annotations

from typing import Literal

import numpy as np

from harness.core.strict import Strict
from harness.layers.activations import DERIVATIVE, ELEMENTWISE, Activation
from harness.layers.base import Context, Cost, Shape, draw_bias, draw_weight
from harness.layers.sizes import PositiveInt

KIND = "dense"
PREFIX = "dense"
TENSORS = ("weight", "bias")  # what init draws, in its order
BUFFERS: tuple[str, ...] = ()


class Section(Strict):
    kind: Literal["dense"] = "dense"
    width: PositiveInt
    activation: Activation = "identity"


def out_shape(section: Section, shape: Shape) -> Shape:
    if len(shape) == 2:  # (positions, width)
        return (shape[0], section.width)
    if len(shape) != 1:
        raise ValueError(f"a dense layer takes a vector, not an image of shape {list(shape)}: put a flatten before it")
    return (section.width,)


def init(section: Section, shape: Shape, rng: np.random.RandomState, scheme) -> dict[str, np.ndarray]:
    fan_in, fan_out = shape[-1], section.width
    weight = draw_weight(rng, scheme.weights, (fan_in, fan_out), fan_in, fan_out)
    return {"weight": weight, "bias": draw_bias(rng, scheme.biases, fan_out, fan_in)}


def cost(section: Section, shape: Shape, first: bool) -> Cost:
    fan_in, fan_out = shape[-1], section.width
    rows = shape[0] if len(shape) == 2 else 1  # a text's positions
    products = 2 if first else 3  # forward and weight gradient; the input gradient above the first layer
    act = section.activation
    flops = rows * (products * 2 * fan_in * fan_out + fan_out * (1 + ELEMENTWISE[act] + DERIVATIVE[act] + 1))
    return Cost(flops=flops, values=rows * fan_out, params=fan_in * fan_out + fan_out, weights=fan_in * fan_out, launches=4)


def affine(a, w, b):
    """A layer's pre-activation. The products are named functions so that the evidence tests
    (tests/test_findings.py) can sum them in another, equally accurate order."""
    return a @ w + b


def weight_gradient(a_in, d_z):
    """d loss / d W: a sum over the batch, the longest sum in a step."""
    return a_in.T @ d_z


def forward(xp, section: Section, p: dict, x, ctx: Context):
    if x.ndim == 3:  # (batch, positions, width): every position a row
        rows = x.reshape(-1, x.shape[-1])
        return affine(rows, p["weight"], p["bias"]).reshape(*x.shape[:-1], section.width), rows
    return affine(x, p["weight"], p["bias"]), x


def backward(xp, section: Section, p: dict, cache, d_z, ctx: Context, need_dx: bool):
    if d_z.ndim == 3:
        d_x, grads = backward(xp, section, p, cache, d_z.reshape(-1, d_z.shape[-1]), ctx, need_dx)
        return (None if d_x is None else d_x.reshape(*d_z.shape[:-1], -1)), grads
    jitter, w = ctx.jitter, p["weight"]
    d_w = jitter(weight_gradient(cache, d_z))
    if ctx.l2_scale:
        d_w = jitter(d_w + (2 * ctx.l2_scale) * w)
    grads = {"weight": d_w, "bias": jitter(d_z.sum(axis=0))}
    return (jitter(d_z @ w.T) if need_dx else None), grads
