"""What max_pool and avg_pool share: the section's window and stride, the output shape
(valid: no padding), no tensors, the cost of reading each window, and the windows."""

from __future__ import annotations

import numpy as np

from harness.core.strict import Strict
from harness.layers import windows as win
from harness.layers.base import Cost, Shape
from harness.layers.sizes import Extent


class PoolSection(Strict):
    window: Extent
    stride: Extent | None = None  # the window, when not given

    @property
    def step(self) -> int:
        return self.stride or self.window


def out_shape(section: PoolSection, shape: Shape) -> Shape:
    out_h, out_w = win.check_fits(shape, section.window, section.step, "valid", section.kind)
    return (shape[0], out_h, out_w)


def init(section, shape, rng, scheme) -> dict[str, np.ndarray]:
    return {}


def cost(section: PoolSection, shape: Shape, first: bool) -> Cost:
    values = int(np.prod(out_shape(section, shape)))
    return Cost(flops=2 * values * section.window * section.window, values=values)


def view(xp, section: PoolSection, x):
    """(N, C, out_h, out_w, window, window): every window of x."""
    out_h = win.out_size(x.shape[2], section.window, section.step)
    out_w = win.out_size(x.shape[3], section.window, section.step)
    return win.windows(xp, x, section.window, section.step, out_h, out_w)
