"""The network written once against an array module `xp` (NumPy or CuPy): forward through
the layer registry's modules (harness/layers/), the loss, the hand-written backward pass,
and the optimizer updates. Parameters and state are one flat mapping from names such as
`dense1.weight`, `conv1.weight`, `bn1.running_mean` to arrays, in the spec's layout.

Bound to NumPy in float64 it is the reference oracle; bound to NumPy in float32 it is the
NumPy adapter's eager path; bound to CuPy it runs on the GPU. It imports no framework.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from harness.layers import ACTIVATED, Placed
from harness.layers.activations import activate, activation_grad
from harness.layers.base import Context, plain

Array = Any
Jitter = Callable[[Array], Array]
Params = dict[str, Array]

__all__ = ["Context", "plain", "activate", "activation_grad"]


def jitter_function(xp, seed: int) -> Jitter:
    """Each call moves every element of an array, at random, by at most two units in its
    last place (a + a*u rounded, u uniform in [-eps, eps], seeded; the sign kept, zero
    kept): another honest rounding of every value, as an implementation computing
    it by another formula would give. The calibration members (harness.inputs.members.reordered) run
    with it over their first steps."""
    rng = np.random.default_rng(seed)

    def jitter(a: Array) -> Array:
        eps = xp.finfo(a.dtype).eps
        u = xp.asarray(rng.uniform(-eps, eps, a.shape).astype(a.dtype))
        return a + a * u

    return jitter


def weights(placed: list[Placed], params: Params) -> list[Array]:
    """The tensors an L2 penalty sums: the weights of the dense and conv layers."""
    return [params[f"{p.name}.weight"] for p in placed if p.module.KIND in ACTIVATED]


def trained_names(placed: list[Placed]) -> list[str]:
    return [name for p in placed for name in p.trained]


def _local(p: Placed, params: Params) -> dict[str, Array]:
    return {k: params[f"{p.name}.{k}"] for k in p.local_names}


def forward(xp, placed: list[Placed], params: Params, x: Array, ctx: Context, outputs: dict | None = None) -> tuple[Array, list]:
    """Outputs, and what each layer keeps for the backward pass. In training, the new
    running statistics land in ctx.updates by their full names; each layer's output (after
    its activation) lands in `outputs`, by the layer's name, when given."""
    jitter = ctx.jitter
    a = x.reshape((x.shape[0], *placed[0].in_shape)) if len(placed[0].in_shape) > 1 else x
    caches = []
    for p in placed:
        ctx.layer = p.name
        out, cache = p.module.forward(xp, p.section, _local(p, params), a, ctx)
        for local in [k for k in ctx.updates if "." not in k]:
            ctx.updates[f"{p.name}.{local}"] = ctx.updates.pop(local)
        if p.activation is not None:
            z = jitter(out)
            a = jitter(activate(xp, z, p.activation))
            caches.append((cache, z, a))
        else:
            a = jitter(out)
            caches.append((cache, None, a))
        if outputs is not None:
            outputs[p.name] = a
    return a, caches


def log_softmax(xp, logits: Array) -> Array:
    shifted = logits - logits.max(axis=1, keepdims=True)
    return shifted - xp.log(xp.exp(shifted).sum(axis=1, keepdims=True))


def l2_scale(loss_section, n_examples: int) -> float:
    """The multiplier of sum(W^2): lambda/2, divided by N when the spec says so."""
    l2 = loss_section.l2
    if l2 is None:
        return 0.0
    return l2.coefficient / 2 / (n_examples if l2.divide_by_examples else 1)


def data_loss(xp, outputs: Array, targets: Array, loss_section) -> tuple[Array, Array]:
    """The data term of the loss and its gradient with respect to the outputs."""
    n = outputs.shape[0]
    if loss_section.kind == "mse":
        diff = outputs - targets
        total = (diff * diff).sum()
        d_out = 2 * diff
        denom = diff.size if loss_section.reduction == "mean" else 1
    else:
        logp = log_softmax(xp, outputs)
        rows = xp.arange(n)
        total = -logp[rows, targets].sum()
        d_out = xp.exp(logp)
        d_out[rows, targets] -= 1
        denom = n if loss_section.reduction == "mean" else 1
    return total / denom, d_out / denom


def objective(xp, placed: list[Placed], params: Params, outputs: Array, targets: Array, loss_section, n_examples: int) -> Array:
    """The full training loss: the data term plus the L2 penalty on the weights."""
    value, _ = data_loss(xp, outputs, targets, loss_section)
    scale = l2_scale(loss_section, n_examples)
    if scale:
        value = value + scale * sum((w * w).sum() for w in weights(placed, params))
    return value


def loss_and_grads(xp, placed: list[Placed], params: Params, x: Array, targets: Array, loss_section, n_examples: int, ctx: Context):
    """The training loss of a batch, its gradient for every trained tensor (by name, in the
    network's order) and the new running statistics; `ctx.jitter` rounds every intermediate
    array once more (a calibration member's, see jitter_function)."""
    jitter = ctx.jitter
    ctx.l2_scale = l2_scale(loss_section, n_examples)
    outputs, caches = forward(xp, placed, params, x, ctx)
    loss, d_a = data_loss(xp, outputs, targets, loss_section)
    d_a = jitter(d_a)
    found: dict[str, Array] = {}
    for i in reversed(range(len(placed))):
        p = placed[i]
        cache, z, a_out = caches[i]
        ctx.layer = p.name
        if p.activation is not None:
            d_a = jitter(d_a * activation_grad(xp, z, a_out, p.activation))
        d_a, grads = p.module.backward(xp, p.section, _local(p, params), cache, d_a, ctx, i > 0)
        found.update({f"{p.name}.{k}": g for k, g in grads.items()})
    if ctx.l2_scale:
        loss = loss + ctx.l2_scale * sum((w * w).sum() for w in weights(placed, params))
    return loss, {name: found[name] for name in trained_names(placed)}, ctx.updates


def sgd_update(params: Params, grads: Params, lr: float, jitter: Jitter = plain) -> Params:
    return {**params, **{name: params[name] - jitter(lr * g) for name, g in grads.items()}}


def adam_init(xp, params: Params, names: list[str]):
    return {"t": 0, "m": {n: xp.zeros_like(params[n]) for n in names}, "v": {n: xp.zeros_like(params[n]) for n in names}}


def bias_corrections(opt, t: int) -> tuple[float, float]:
    """1 - beta1^t and 1 - beta2^t, in Python floats (as torch.optim computes them)."""
    return 1 - opt.beta1**t, 1 - opt.beta2**t


def adam_denominator(xp, v_hat: Array, eps: float) -> Array:
    return xp.sqrt(v_hat) + eps


def adam_update(xp, params: Params, grads: Params, state, opt, corrections=bias_corrections, denominator=adam_denominator, jitter: Jitter = plain):
    """Adam (Kingma & Ba; Flux, torch.optim and optax agree): eps added to sqrt(v_hat).

    `corrections` and `denominator` are the definition's two places where implementations
    differ; tests swap them to reproduce such differences.
    """
    t = state["t"] + 1
    c1, c2 = corrections(opt, t)
    new_params, new_m, new_v = dict(params), {}, {}
    for name, g in grads.items():
        m = jitter(opt.beta1 * state["m"][name] + (1 - opt.beta1) * g)
        v = jitter(opt.beta2 * state["v"][name] + (1 - opt.beta2) * (g * g))
        new_params[name] = params[name] - jitter(opt.lr * (m / c1) / denominator(xp, v / c2, opt.eps))
        new_m[name], new_v[name] = m, v
    return new_params, {"t": t, "m": new_m, "v": new_v}


def train_step(xp, placed: list[Placed], params: Params, opt_state, x: Array, targets: Array, spec, n_examples: int, ctx: Context):
    """One optimizer step of the spec: the loss before it, the parameters and running
    statistics after it, and the optimizer state."""
    loss, grads, updates = loss_and_grads(xp, placed, params, x, targets, spec.loss, n_examples, ctx)
    if spec.optimizer.kind == "adam":
        params, opt_state = adam_update(xp, params, grads, opt_state, spec.optimizer, jitter=ctx.jitter)
    else:
        params = sgd_update(params, grads, spec.optimizer.lr, ctx.jitter)
    return loss, {**params, **updates}, opt_state


def predict(xp, placed: list[Placed], params: Params, x: Array, jitter: Jitter = plain) -> Array:
    """Outputs in evaluation: running statistics, no dropout."""
    outputs, _ = forward(xp, placed, params, x, Context(train=False, jitter=jitter))
    return outputs
