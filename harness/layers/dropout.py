"""`dropout`: in training, each value kept or zeroed by a mask the harness draws once, in
NumPy, seeded, per step and per layer (no two frameworks draw the same mask), kept values
scaled by 1 / (1 - rate). The mask handed to every framework holds 0 or 1 / (1 - rate), so
that each multiplies once. Off in evaluation."""

from __future__ import annotations

from typing import Annotated, Literal

import numpy as np
from pydantic import Field

from harness.core.strict import Strict
from harness.layers.base import Context, Shape, elementwise_cost, no_tensors, same_shape

KIND = "dropout"
PREFIX = "dropout"
TENSORS: tuple[str, ...] = ()
BUFFERS: tuple[str, ...] = ()


class Section(Strict):
    kind: Literal["dropout"]
    rate: Annotated[float, Field(ge=0, lt=1)]


out_shape = same_shape
init = no_tensors
cost = elementwise_cost


def kept(section: Section, shape: Shape, steps: int, rows: int, seed: list[int]) -> np.ndarray:
    """(steps, rows, *shape) booleans: which values each step keeps, drawn once from `seed`."""
    return np.random.default_rng(seed).random((steps, rows, *shape)) >= section.rate


def scaled(section: Section, kept: np.ndarray, dtype) -> np.ndarray:
    """The mask handed to every framework: 0 where dropped, 1 / (1 - rate) where kept, in `dtype`."""
    return np.where(kept, np.asarray(1 / (1 - section.rate), dtype=dtype), np.asarray(0, dtype=dtype))


def forward(xp, section: Section, p: dict, x, ctx: Context):
    if not ctx.train:
        return x, None
    mask = ctx.masks[ctx.layer]
    return x * mask, mask


def backward(xp, section: Section, p: dict, cache, d_y, ctx: Context, need_dx: bool):
    return d_y * cache, {}
