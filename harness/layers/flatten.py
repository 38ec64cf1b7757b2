"""`flatten`: an image (channels, height, width) as one vector, in that order (torch's
nn.Flatten on NCHW). A framework that keeps images as NHWC must transpose before it
flattens, or the next dense layer sees its inputs permuted: the classic porting bug."""

from __future__ import annotations

from typing import Literal

import numpy as np

from harness.core.strict import Strict
from harness.layers.base import Context, Cost, Shape, features

KIND = "flatten"
PREFIX = "flatten"
TENSORS: tuple[str, ...] = ()
BUFFERS: tuple[str, ...] = ()


class Section(Strict):
    kind: Literal["flatten"]


def out_shape(section: Section, shape: Shape) -> Shape:
    return (features(shape),)


def init(section, shape, rng, scheme) -> dict[str, np.ndarray]:
    return {}


def cost(section: Section, shape: Shape, first: bool) -> Cost:
    return Cost(flops=0, values=features(shape), launches=0)


def forward(xp, section: Section, p: dict, x, ctx: Context):
    return x.reshape(x.shape[0], -1), x.shape


def backward(xp, section: Section, p: dict, cache, d_y, ctx: Context, need_dx: bool):
    return d_y.reshape(cache), {}
