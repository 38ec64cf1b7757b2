"""A bf16 envelope member rounding where JAX rounds on the CPU (issue 86): torch's autocast run
with each biased nn.Linear and nn.Conv2d computed as flax computes it in bfloat16, by XLA:CPU.
flax adds a bias in the module's dtype (`y + bias.astype(bfloat16)`) after its product, so:

- the product is rounded to bfloat16 before the bias is added, and the sum rounded again,
  where torch's autocast adds the bias inside its fused kernel and rounds once (about 3 in 10
  of a layer's outputs one bfloat16 unit apart, tests/test_bf16.py); the member adds it
  after, in bfloat16;
- the bias's gradient is the transpose of that broadcast: a sum of the bfloat16 cotangents
  over every axis but the channel's, which XLA:CPU accumulates in bfloat16 over several axes
  (a conv's batch and pixels, a text's batch and positions) where torch sums in float32. The
  member hands its own cotangents, channels last as flax lays them out, to that same
  transpose, jitted, and takes its sum for the bias's gradient.

- the harness's own attention (adapters/torch_layers.py SelfAttention) as flax's
  dot_product_attention computes it in bfloat16: q divided by sqrt(head width) in bfloat16,
  the scores, their softmax and its product with v each in bfloat16 (torch's fused CPU
  kernel keeps the scores and softmax in float32; on a drawn transformer of 3 heads of width
  6, flax's first attention output differed from it in 53% of values, docs/measurements.md).

The rest of its step is torch's autocast run's."""

from __future__ import annotations

import functools
import math

import numpy as np


def as_xla(torch, model) -> list:
    """The model's biased Linear and Conv2d layers made to add their bias after rounding their
    product (`_bias_after`), and the (module, cotangent) pairs of their outputs, filled by
    each backward pass (a hook on each layer's output)."""
    seen: list = []

    def keep(module, _inputs, output):
        if output.requires_grad:
            output.register_hook(lambda g: seen.append((module, g)))

    for module in model.modules():
        if isinstance(module, (torch.nn.Linear, torch.nn.Conv2d)) and module.bias is not None:
            module.forward = _bias_after(torch, module)
            module.register_forward_hook(keep)
        if type(module).__qualname__ == "transformer_modules.<locals>.SelfAttention":
            module.attend = _attend_as_flax  # a plain function: the model is deep-copied
    return seen


def _attend_as_flax(f, q, k, v, causal: bool):
    """The heads' attention (adapters/torch_layers.py attend's place) as flax's
    dot_product_attention computes it in the inputs' dtype (bfloat16 here): q / sqrt(head
    width) rounded, the scores, the causal mask's bfloat16 minimum, softmax and the product
    with v, each a bfloat16 result."""
    import torch

    t = q.shape[-2]
    q = q / torch.tensor(math.sqrt(q.shape[-1]), dtype=q.dtype)
    scores = torch.matmul(q, k.transpose(-1, -2))
    if causal:
        keep = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~keep, torch.finfo(scores.dtype).min)
    return torch.matmul(f.softmax(scores, dim=-1), v)


def _bias_after(torch, module):
    """The layer's forward as flax's in bfloat16: its product without the bias (under autocast,
    rounded to bfloat16), then the bias in the product's dtype added (rounded again)."""
    F = torch.nn.functional
    conv = isinstance(module, torch.nn.Conv2d)

    def forward(x):
        if conv:
            y = module._conv_forward(x, module.weight, None)
            return y + module.bias.to(y.dtype).view(-1, 1, 1)
        y = F.linear(x, module.weight)
        return y + module.bias.to(y.dtype)

    return forward


@functools.cache
def _transpose(shape: tuple[int, ...]):
    """JAX's gradient of a float32 bias added in bfloat16 to an array of `shape` (channels
    last), as a function of that array's cotangent: XLA:CPU's own sum."""
    import jax
    import jax.numpy as jnp

    def grad(cotangent):
        _, back = jax.vjp(lambda b: jnp.zeros(shape, jnp.bfloat16) + b.astype(jnp.bfloat16), jnp.zeros(shape[-1], jnp.float32))
        return back(cotangent)[0]

    return jax.jit(grad)


def replace_bias_grads(torch, seen: list) -> None:
    """Each watched bias's gradient, summed from this step's cotangents as XLA:CPU sums them;
    the list emptied for the next step."""
    import jax.numpy as jnp

    for module, g in seen:
        values = g.detach().float().cpu().numpy()
        if isinstance(module, torch.nn.Conv2d):
            values = np.moveaxis(values, 1, -1)  # NCHW -> NHWC, flax's layout
        summed = np.array(_transpose(values.shape)(jnp.asarray(values, jnp.bfloat16)), dtype=np.float32)  # a writable copy
        module.bias.grad = torch.from_numpy(summed).to(module.bias.grad)
    seen.clear()
