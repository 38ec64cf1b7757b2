"""`attention`: multi-head self-attention over an example's (context, width) values.

q, k, v = x Wq + bq, x Wk + bk, x Wv + bv (each W stored (in, out), as a dense layer's),
split into `heads` heads of width d = width / heads; with `rope`, q and k rotated by their
position (rotary embeddings); scores q k^T / sqrt(d), with `causal` the keys after each
query masked out; a softmax over the keys, computed stably (the row's maximum subtracted
before exp); the heads' p v joined again and projected, o Wo + bo. `bias: false` drops
the four biases.

RoPE turns each pair of a head's features (a, b) at position t by the angle t * base^(-2i/d),
pair i of d/2: a' = a cos - b sin, b' = a sin + b cos. The `half` layout pairs feature i
with feature i + d/2 (GPT-NeoX, Hugging Face's Llama); `interleaved` pairs 2i with 2i + 1
(RoFormer, GPT-J, Meta's Llama). The angles' cosines and sines are computed in float64 and
rounded once to the run's dtype."""

from __future__ import annotations

import math
from typing import Annotated, Literal

import numpy as np
from pydantic import Field

from harness.core.strict import Strict
from harness.core.threads import unary
from harness.layers.base import Context, Cost, Shape, draw_bias, draw_weight, plain
from harness.layers.sizes import Channels

KIND = "attention"
PREFIX = "attn"
PROJECTIONS = ("q", "k", "v", "out")
TENSORS = tuple(f"{w}_{t}" for w in PROJECTIONS for t in ("weight", "bias"))
BUFFERS: tuple[str, ...] = ()


class Rope(Strict):
    layout: Literal["half", "interleaved"]
    base: Annotated[float, Field(gt=1)] = 10000.0


class Section(Strict):
    kind: Literal["attention"]
    heads: Channels
    causal: bool = True
    rope: Rope | None = None
    bias: bool = True


def tensors(section: Section) -> tuple[str, ...]:
    """What init draws, in its order: each projection's weight, then its bias (if any)."""
    return TENSORS if section.bias else tuple(f"{w}_weight" for w in PROJECTIONS)


def out_shape(section: Section, shape: Shape) -> Shape:
    if len(shape) != 2:
        raise ValueError(f"attention takes (positions, width) values, not of shape {list(shape)}: put it after an embedding")
    width = shape[1]
    if width % section.heads:
        raise ValueError(f"a width of {width} does not split into {section.heads} heads")
    if section.rope is not None and (width // section.heads) % 2:
        raise ValueError(f"rope turns pairs of a head's features: a head width of {width // section.heads} is odd")
    return shape


def init(section: Section, shape: Shape, rng: np.random.RandomState, scheme) -> dict[str, np.ndarray]:
    width = shape[1]
    drawn = {}
    for w in PROJECTIONS:
        drawn[f"{w}_weight"] = draw_weight(rng, scheme.weights, (width, width), width, width)
        if section.bias:
            drawn[f"{w}_bias"] = draw_bias(rng, scheme.biases, width, width)
    return drawn


def cost(section: Section, shape: Shape, first: bool) -> Cost:
    t, width = shape
    projections = 4 * 3 * 2 * t * width * width  # forward, weight and input gradients
    scores = 2 * 3 * 2 * t * t * width  # q k^T and p v, forward and both gradients
    softmax = 10 * section.heads * t * t
    params = 4 * width * width + (4 * width if section.bias else 0)
    return Cost(
        flops=projections + scores + softmax, values=4 * t * width + 2 * section.heads * t * t, params=params, weights=4 * width * width, launches=24
    )


def _project(a, p: dict, w: str):
    """a (rows, in) through one projection."""
    z = a @ p[f"{w}_weight"]
    bias = p.get(f"{w}_bias")
    return z if bias is None else z + bias


def _split(a, batch: int, heads: int):
    """(batch * positions, width) -> (batch, heads, positions, head width)."""
    t = a.shape[0] // batch
    return a.reshape(batch, t, heads, -1).transpose(0, 2, 1, 3)


def _join(a):
    """(batch, heads, positions, head width) -> (batch * positions, width)."""
    b, h, t, d = a.shape
    return a.transpose(0, 2, 1, 3).reshape(b * t, h * d)


def angles(xp, rope: Rope, positions: int, head_width: int, dtype):
    """cos and sin of position t's angle of pair i, (positions, head width / 2), computed in
    float64 and rounded to `dtype`."""
    inverse = rope.base ** (-np.arange(0, head_width, 2, dtype=np.float64) / head_width)
    theta = np.outer(np.arange(positions, dtype=np.float64), inverse)
    return xp.asarray(np.cos(theta).astype(dtype)), xp.asarray(np.sin(theta).astype(dtype))


def rotate(xp, a, rope: Rope, cos, sin, low=plain):
    """a (..., positions, head width) with each pair turned by its angle (RoPE); with -sin,
    turned back (the rotation's transpose, its backward). A bf16 run (`low`) rounds each
    product and the sum, as torch computes a * cos + rotate_half(a) * sin in bfloat16."""
    if rope.layout == "half":
        half = a.shape[-1] // 2
        first, second = a[..., :half], a[..., half:]
        if low is not plain:
            return low(xp.concatenate([low(first * cos) - low(second * sin), low(second * cos) + low(first * sin)], axis=-1))
        return xp.concatenate([first * cos - second * sin, first * sin + second * cos], axis=-1)
    first, second = a[..., 0::2], a[..., 1::2]
    return xp.stack([first * cos - second * sin, first * sin + second * cos], axis=-1).reshape(a.shape)


def causal_mask(xp, positions: int):
    """True where query t may see key s: s <= t."""
    return xp.tril(xp.ones((positions, positions), dtype=bool))


def softmax(xp, scores, ctx: Context):
    """The softmax over the last axis, the row's maximum subtracted first (masked scores
    are -inf: exp gives 0); a calibration member sums each row's exponentials in its own
    order (torch's CPU kernel sums them block by block, online)."""
    jitter = ctx.jitter
    top = scores.max(axis=-1, keepdims=True)
    e = jitter(unary(xp, xp.exp, scores - top))
    return jitter(e / jitter(ctx.total(xp, e, e.ndim - 1)[..., None]))


def _low(ctx: Context):
    """A bf16 run's rounding to bfloat16 where torch's autocast on the CPU computes in it
    (harness/reference/autocast.py): the projections' outputs, RoPE's cos, sin and turned
    values, the fused attention's output (`fused`), and going back the gradient of each of
    those; `plain` in every other run."""
    return plain if ctx.autocast is None else ctx.autocast.low


def fused(xp, scores, v, low):
    """A bf16 run's attention as torch's fused kernel on the CPU computes it: the scores and
    their exponentials in float32, the exponentials rounded to bfloat16 for the product with
    v (summed in float32), divided by their float32 sum, rounded once. On random bfloat16
    q, k, v (8 x 4 heads x 32 positions x 8) its output is torch 2.13's in 96.9% of values and
    one bfloat16 unit off in the rest, where softmax's probabilities rounded before the
    product are in 58% (docs/measurements.md). The probabilities the backward pass takes
    (float32), and the output joined."""
    top = scores.max(axis=-1, keepdims=True)
    e = unary(xp, xp.exp, scores - top)
    total = e.sum(axis=-1, keepdims=True)
    return e / total, _join(low((low(e) @ v) / total))


def forward(xp, section: Section, p: dict, x, ctx: Context):
    jitter, low = ctx.jitter, _low(ctx)
    batch, t, width = x.shape
    rows = x.reshape(batch * t, width)
    q, k, v = (_split(low(jitter(_project(rows, p, w))), batch, section.heads) for w in ("q", "k", "v"))
    head_width = width // section.heads
    turns = None
    if section.rope is not None:
        turns = angles(xp, section.rope, t, head_width, x.dtype)
        if section.rope.layout == "half":  # in bfloat16 (rotate_half's cos and sin in q's dtype); Meta's in float32
            turns = tuple(low(a) for a in turns)
        q, k = (low(jitter(rotate(xp, a, section.rope, *turns, low))) for a in (q, k))
    scale = 1 / math.sqrt(head_width)
    scores = jitter(jitter(q @ k.swapaxes(-1, -2)) * scale)
    if section.causal:
        scores = xp.where(causal_mask(xp, t), scores, -xp.inf)
    if ctx.autocast is None:
        probs = softmax(xp, scores, ctx)
        joined = _join(jitter(probs @ v))
    else:
        probs, joined = fused(xp, scores, v, low)
    out = _project(joined, p, "out")
    return out.reshape(batch, t, width), (rows, q, k, v, probs, joined, turns)


def backward(xp, section: Section, p: dict, cache, d_y, ctx: Context, need_dx: bool):
    jitter, low = ctx.jitter, _low(ctx)
    rows, q, k, v, probs, joined, turns = cache
    batch, t, width = d_y.shape
    d_out = d_y.reshape(batch * t, width)
    grads = {"out_weight": jitter(joined.T @ d_out)}
    if section.bias:
        grads["out_bias"] = jitter(d_out.sum(axis=0))
    d_o = _split(low(jitter(d_out @ p["out_weight"].T)), batch, section.heads)
    d_v = low(jitter(probs.swapaxes(-1, -2) @ d_o))
    d_p = jitter(d_o @ v.swapaxes(-1, -2))
    scale = 1 / math.sqrt(width // section.heads)
    d_s = jitter(probs * (d_p - jitter(ctx.total(xp, d_p * probs, d_p.ndim - 1)[..., None]))) * scale
    d_q, d_k = low(jitter(d_s @ k)), low(jitter(d_s.swapaxes(-1, -2) @ q))
    if turns is not None:
        cos, sin = turns
        d_q, d_k = (low(rotate(xp, a, section.rope, cos, -sin)) for a in (d_q, d_k))
    d_x = None
    for w, d in (("q", d_q), ("k", d_k), ("v", d_v)):
        d_rows = _join(d)
        grads[f"{w}_weight"] = jitter(rows.T @ d_rows)
        if section.bias:
            grads[f"{w}_bias"] = jitter(d_rows.sum(axis=0))
        if need_dx:
            through = low(jitter(d_rows @ p[f"{w}_weight"].T))
            d_x = through if d_x is None else low(jitter(d_x + through))
    ordered = {name: grads[name] for name in tensors(section)}
    return (None if d_x is None else d_x.reshape(batch, t, width)), ordered
