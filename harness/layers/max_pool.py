"""`max_pool`: the largest value of each window (valid: no padding), channel by channel.
Its gradient goes to the window's first largest value (row-major), as torch's CPU kernel
and XLA's select-and-scatter pick it."""

from __future__ import annotations

from typing import Literal

from harness.layers import windows as win
from harness.layers.base import Context
from harness.layers.pooling import PoolSection, cost, init, out_shape, view

KIND = "max_pool"
PREFIX = "maxpool"
TENSORS: tuple[str, ...] = ()
BUFFERS: tuple[str, ...] = ()
__all__ = ["Section", "out_shape", "init", "cost", "forward", "backward"]


class Section(PoolSection):
    kind: Literal["max_pool"]


def forward(xp, section: Section, p: dict, x, ctx: Context):
    windows = view(xp, section, x)
    flat = windows.reshape(*windows.shape[:4], -1)
    first = flat.argmax(axis=-1)
    return flat.max(axis=-1), (x.shape, first)


def backward(xp, section: Section, p: dict, cache, d_y, ctx: Context, need_dx: bool):
    shape, first = cache
    k = section.window
    picked = (xp.arange(k * k) == first[..., None]).astype(d_y.dtype)
    d_windows = (picked * d_y[..., None]).reshape(*d_y.shape, k, k)
    return win.unwindow(xp, d_windows, shape, k, section.step), {}
