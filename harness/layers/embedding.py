"""`embedding`: each token id's row of a (vocabulary, width) table; an example of `context`
ids becomes (context, width). The vocabulary is the data's (256 for `tokens: bytes`): the
spec's model learns it from a text data section (harness/spec/model.py). It must be the
first layer: its input is the token ids, which have no gradient.

The table is drawn by the spec's weight scheme with torch's fans of an nn.Embedding weight
(fan_in = width, its second axis; fan_out = vocabulary)."""

from __future__ import annotations

from typing import Literal

import numpy as np

from harness.core.strict import Strict
from harness.layers.base import Context, Cost, Shape, draw_weight
from harness.layers.sizes import Channels, PositiveInt

KIND = "embedding"
PREFIX = "embed"
TENSORS = ("weight",)
BUFFERS: tuple[str, ...] = ()


class Section(Strict):
    kind: Literal["embedding"]
    width: Channels
    # The number of token ids; left out, the data's (the model fills it in when it is placed).
    vocabulary: PositiveInt | None = None


def out_shape(section: Section, shape: Shape) -> Shape:
    if len(shape) != 1:
        raise ValueError(f"an embedding takes an example's token ids, not values of shape {list(shape)}: make it the first layer")
    if section.vocabulary is None:
        raise ValueError("an embedding needs token ids: give the model text data (or the embedding a vocabulary)")
    return (shape[0], section.width)


def init(section: Section, shape: Shape, rng: np.random.RandomState, scheme) -> dict[str, np.ndarray]:
    return {"weight": draw_weight(rng, scheme.weights, (section.vocabulary, section.width), section.width, section.vocabulary)}


def cost(section: Section, shape: Shape, first: bool) -> Cost:
    values = shape[0] * section.width
    return Cost(flops=2 * values, values=values, params=section.vocabulary * section.width)


def token_ids(xp, x):
    """The ids as integers: the inputs reach the layers in the run's float dtype, where
    every id below 2**24 is exact."""
    return x.astype(xp.int64)


def forward(xp, section: Section, p: dict, x, ctx: Context):
    ids = token_ids(xp, x)
    return p["weight"][ids], ids


def backward(xp, section: Section, p: dict, cache, d_y, ctx: Context, need_dx: bool):
    """Each row of the table gets the sum of the gradients at the positions holding its id,
    added in the order of the positions (example by example)."""
    ids = cache
    d_w = xp.zeros_like(p["weight"])
    xp.add.at(d_w, ids.reshape(-1), d_y.reshape(-1, d_y.shape[-1]))
    return None, {"weight": ctx.jitter(d_w)}
