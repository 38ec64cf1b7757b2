"""`residual`: out = x + f(x), f the layers nested under its `layers`, which must give back
x's shape.

In the placed network (harness.layers.place) the nested layers are flattened in order,
numbered as any others, and followed by the residual itself, which names where its body
starts (Placed.start): the network keeps x where the body starts (Context.skips) and adds it
at the residual; going back, the residual's gradient goes into the body and, past it, is
added to the gradient of the body's input (Context.skip_grads)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import Field

from harness.core.strict import Strict
from harness.layers.base import Context, elementwise_cost, no_tensors, same_shape

if TYPE_CHECKING:
    from harness.layers import LayerSection

KIND = "residual"
PREFIX = "res"
TENSORS: tuple[str, ...] = ()
BUFFERS: tuple[str, ...] = ()
MAX_NESTED = 32  # layers in one residual body


class Section(Strict):
    kind: Literal["residual"]
    layers: Annotated[list[LayerSection], Field(min_length=1, max_length=MAX_NESTED)]


out_shape = same_shape
init = no_tensors
cost = elementwise_cost


def forward(xp, section: Section, p: dict, x, ctx: Context):
    return x + ctx.skips.pop(ctx.layer), None


def backward(xp, section: Section, p: dict, cache, d_y, ctx: Context, need_dx: bool):
    ctx.skip_grads[ctx.layer] = d_y
    return d_y, {}
