"""`conv2d`: a 2-D convolution (cross-correlation, as torch and flax compute it) with a
bias, then the activation. The weight is stored [filters, channels, kh, kw] (torch's OIHW);
padding is valid, same (JAX's rule: the odd pixel at the bottom and right) or explicit.
The oracle takes the windows (im2col) and multiplies: one product per step and direction."""

from __future__ import annotations

from typing import Literal

import numpy as np

from harness.core.strict import Strict
from harness.layers import windows as win
from harness.layers.activations import DERIVATIVE, ELEMENTWISE, Activation
from harness.layers.base import Context, Cost, Shape, draw_bias, draw_weight
from harness.layers.sizes import Channels, Extent

KIND = "conv2d"
PREFIX = "conv"
TENSORS = ("weight", "bias")
BUFFERS: tuple[str, ...] = ()


class Section(Strict):
    kind: Literal["conv2d"]
    filters: Channels
    kernel: Extent
    stride: Extent = 1
    padding: win.Padding = "valid"
    activation: Activation = "identity"


def out_shape(section: Section, shape: Shape) -> Shape:
    out_h, out_w = win.check_fits(shape, section.kernel, section.stride, section.padding, "conv2d")
    return (section.filters, out_h, out_w)


def fans(section: Section, shape: Shape) -> tuple[int, int]:
    """torch's and flax's: channels x kh x kw in, filters x kh x kw out."""
    area = section.kernel * section.kernel
    return shape[0] * area, section.filters * area


def init(section: Section, shape: Shape, rng: np.random.RandomState, scheme) -> dict[str, np.ndarray]:
    fan_in, fan_out = fans(section, shape)
    size = (section.filters, shape[0], section.kernel, section.kernel)
    weight = draw_weight(rng, scheme.weights, size, fan_in, fan_out)
    return {"weight": weight, "bias": draw_bias(rng, scheme.biases, section.filters, fan_in)}


def cost(section: Section, shape: Shape, first: bool) -> Cost:
    """Per example: each output value is a dot of fan_in terms, in the forward pass, the
    weight gradient and (above the first layer) the input gradient."""
    out = out_shape(section, shape)
    fan_in, _ = fans(section, shape)
    values = int(np.prod(out))
    products = 2 if first else 3
    act = section.activation
    flops = products * 2 * fan_in * values + values * (1 + ELEMENTWISE[act] + DERIVATIVE[act] + 1)
    weights = section.filters * fan_in
    return Cost(flops=flops, values=values, params=weights + section.filters, weights=weights, launches=6)


def _columns(xp, section: Section, x):
    """The windows as rows: (N * out_h * out_w, channels * kh * kw), and the padding used."""
    n, c, h, w = x.shape
    pad = win.pads(section.padding, h, w, section.kernel, section.stride)
    xp_ = win.padded(xp, x, pad)
    out_h = win.out_size(h, section.kernel, section.stride, *pad[0])
    out_w = win.out_size(w, section.kernel, section.stride, *pad[1])
    view = win.windows(xp, xp_, section.kernel, section.stride, out_h, out_w)
    cols = view.transpose(0, 2, 3, 1, 4, 5).reshape(n * out_h * out_w, c * section.kernel * section.kernel)
    return cols, pad, xp_.shape, (n, out_h, out_w)


def forward(xp, section: Section, p: dict, x, ctx: Context):
    cols, pad, padded_shape, (n, out_h, out_w) = _columns(xp, section, x)
    kernel = p["weight"].reshape(section.filters, -1)
    z = (cols @ kernel.T + p["bias"]).reshape(n, out_h, out_w, section.filters).transpose(0, 3, 1, 2)
    return z, (cols, pad, padded_shape)


def backward(xp, section: Section, p: dict, cache, d_z, ctx: Context, need_dx: bool):
    jitter, w = ctx.jitter, p["weight"]
    cols, pad, padded_shape = cache
    n, f, out_h, out_w = d_z.shape
    rows = d_z.transpose(0, 2, 3, 1).reshape(n * out_h * out_w, f)
    if ctx.reorder is not None:  # a calibration member: the sums over the batch's pixels in another order
        order = xp.asarray(ctx.reorder.permutation(len(rows)))
        rows, cols = rows[order], cols[order]
    d_w = jitter((rows.T @ cols).reshape(w.shape))
    if ctx.l2_scale:
        d_w = jitter(d_w + (2 * ctx.l2_scale) * w)
    grads = {"weight": d_w, "bias": jitter(ctx.total(xp, rows, 0))}
    if not need_dx:
        return None, grads
    k, c = section.kernel, w.shape[1]
    d_cols = (rows @ w.reshape(f, -1)).reshape(n, out_h, out_w, c, k, k).transpose(0, 3, 1, 2, 4, 5)
    d_x = win.unwindow(xp, d_cols, padded_shape, k, section.stride)
    return jitter(win.unpadded(d_x, pad)), grads
