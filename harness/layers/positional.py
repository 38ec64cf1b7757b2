"""`positional`: learned absolute positions, a (max_len, width) table whose first `context`
rows are added to an example's (context, width) values, row t to position t. Drawn by the
spec's weight scheme with the fans of an nn.Embedding weight (fan_in = width)."""

from __future__ import annotations

from typing import Literal

import numpy as np

from harness.core.strict import Strict
from harness.layers.base import Context, Cost, Shape, draw_weight
from harness.layers.sizes import PositiveInt

KIND = "positional"
PREFIX = "pos"
TENSORS = ("weight",)
BUFFERS: tuple[str, ...] = ()


class Section(Strict):
    kind: Literal["positional"]
    max_len: PositiveInt


def out_shape(section: Section, shape: Shape) -> Shape:
    if len(shape) != 2:
        raise ValueError(f"positional takes (positions, width) values, not of shape {list(shape)}: put it after an embedding")
    if shape[0] > section.max_len:
        raise ValueError(f"max_len {section.max_len} is shorter than the {shape[0]} positions of an example")
    return shape


def init(section: Section, shape: Shape, rng: np.random.RandomState, scheme) -> dict[str, np.ndarray]:
    return {"weight": draw_weight(rng, scheme.weights, (section.max_len, shape[1]), shape[1], section.max_len)}


def cost(section: Section, shape: Shape, first: bool) -> Cost:
    values = shape[0] * shape[1]
    return Cost(flops=2 * values, values=values, params=section.max_len * shape[1])


def forward(xp, section: Section, p: dict, x, ctx: Context):
    return x + p["weight"][: x.shape[1]], x.shape[1]


def backward(xp, section: Section, p: dict, cache, d_y, ctx: Context, need_dx: bool):
    d_w = xp.zeros_like(p["weight"])
    d_w[:cache] = ctx.total(xp, d_y, 0)
    return d_y, {"weight": ctx.jitter(d_w)}
