"""`avg_pool`: the mean of each window (valid: no padding), channel by channel."""

from __future__ import annotations

from typing import Literal

from harness.layers import windows as win
from harness.layers.base import Context
from harness.layers.pooling import PoolSection, cost, init, out_shape, view

KIND = "avg_pool"
PREFIX = "avgpool"
TENSORS: tuple[str, ...] = ()
BUFFERS: tuple[str, ...] = ()
__all__ = ["Section", "out_shape", "init", "cost", "forward", "backward"]


class Section(PoolSection):
    kind: Literal["avg_pool"]


def forward(xp, section: Section, p: dict, x, ctx: Context):
    return view(xp, section, x).sum(axis=(4, 5)) / (section.window * section.window), x.shape


def backward(xp, section: Section, p: dict, cache, d_y, ctx: Context, need_dx: bool):
    k = section.window
    share = d_y / (k * k)
    d_windows = xp.broadcast_to(share[..., None, None], (*share.shape, k, k))
    return win.unwindow(xp, d_windows, cache, k, section.step), {}
