"""The MLP written once against an array module `xp` (NumPy or CuPy): forward, loss,
hand-written backward pass, and the optimizer updates.

Bound to NumPy in float64 it is the reference oracle; bound to NumPy in float32 it is the
CuPy adapter's CPU path; bound to CuPy it runs on the GPU. It imports no framework.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

Array = Any
Jitter = Callable[[Array], Array]


def plain(a: Array) -> Array:
    return a


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


def activate(xp, z: Array, name: str) -> Array:
    if name == "relu":
        return xp.maximum(z, 0)
    if name == "tanh":
        return xp.tanh(z)
    return z


def activation_grad(xp, z: Array, a: Array, name: str) -> Array:
    """d act / d z, from the pre-activation z and the activation a = act(z)."""
    if name == "relu":
        return (z > 0).astype(z.dtype)
    if name == "tanh":
        return 1 - a * a
    return xp.ones_like(z)


def affine(a: Array, w: Array, b: Array) -> Array:
    """A layer's pre-activation. The products are named functions so that the evidence tests
    (tests/test_findings.py) can sum them in another, equally accurate order."""
    return a @ w + b


def weight_gradient(a_in: Array, d_z: Array) -> Array:
    """d loss / d W: a sum over the batch, the longest sum in a step."""
    return a_in.T @ d_z


def forward(xp, params, x: Array, activations: list[str], jitter: Jitter = plain) -> tuple[Array, list[tuple[Array, Array]]]:
    """Outputs and the (input, pre-activation) of every layer, kept for the backward pass."""
    cache = []
    a = x
    for (w, b), act in zip(params, activations):
        z = jitter(affine(a, w, b))
        cache.append((a, z))
        a = jitter(activate(xp, z, act))
    return a, cache


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


def objective(xp, params, outputs: Array, targets: Array, loss_section, n_examples: int) -> Array:
    """The full training loss: the data term plus the L2 penalty on the weights."""
    value, _ = data_loss(xp, outputs, targets, loss_section)
    scale = l2_scale(loss_section, n_examples)
    if scale:
        value = value + scale * sum((w * w).sum() for w, _ in params)
    return value


def loss_and_grads(xp, params, x: Array, targets: Array, activations, loss_section, n_examples: int, jitter: Jitter = plain):
    """The training loss of a batch and its gradient for every (W, b); `jitter` rounds every
    intermediate array once more (a calibration member's, see jitter_function)."""
    outputs, cache = forward(xp, params, x, activations, jitter)
    loss, d_a = data_loss(xp, outputs, targets, loss_section)
    d_a = jitter(d_a)
    scale = l2_scale(loss_section, n_examples)
    grads = [None] * len(params)
    for i in reversed(range(len(params))):
        a_in, z = cache[i]
        a_out = outputs if i == len(params) - 1 else cache[i + 1][0]
        d_z = jitter(d_a * activation_grad(xp, z, a_out, activations[i]))
        w = params[i][0]
        d_w = jitter(weight_gradient(a_in, d_z))
        if scale:
            d_w = jitter(d_w + (2 * scale) * w)
        grads[i] = (d_w, jitter(d_z.sum(axis=0)))
        if i:
            d_a = jitter(d_z @ w.T)
    if scale:
        loss = loss + scale * sum((w * w).sum() for w, _ in params)
    return loss, grads


def sgd_update(params, grads, lr: float, jitter: Jitter = plain):
    return [(w - jitter(lr * dw), b - jitter(lr * db)) for (w, b), (dw, db) in zip(params, grads)]


def adam_init(xp, params):
    zeros = [(xp.zeros_like(w), xp.zeros_like(b)) for w, b in params]
    return {"t": 0, "m": zeros, "v": [(xp.zeros_like(w), xp.zeros_like(b)) for w, b in params]}


def bias_corrections(opt, t: int) -> tuple[float, float]:
    """1 - beta1^t and 1 - beta2^t, in Python floats (as torch.optim computes them)."""
    return 1 - opt.beta1**t, 1 - opt.beta2**t


def adam_denominator(xp, v_hat: Array, eps: float) -> Array:
    return xp.sqrt(v_hat) + eps


def adam_update(xp, params, grads, state, opt, corrections=bias_corrections, denominator=adam_denominator, jitter: Jitter = plain):
    """Adam (Kingma & Ba; Flux, torch.optim and optax agree): eps added to sqrt(v_hat).

    `corrections` and `denominator` are the definition's two places where implementations
    differ; tests swap them to reproduce such differences.
    """
    t = state["t"] + 1
    c1, c2 = corrections(opt, t)
    new_params, new_m, new_v = [], [], []
    for p_pair, g_pair, m_pair, v_pair in zip(params, grads, state["m"], state["v"]):
        layer_p, layer_m, layer_v = [], [], []
        for p, g, m, v in zip(p_pair, g_pair, m_pair, v_pair):
            m = jitter(opt.beta1 * m + (1 - opt.beta1) * g)
            v = jitter(opt.beta2 * v + (1 - opt.beta2) * (g * g))
            p = p - jitter(opt.lr * (m / c1) / denominator(xp, v / c2, opt.eps))
            layer_p.append(p)
            layer_m.append(m)
            layer_v.append(v)
        new_params.append(tuple(layer_p))
        new_m.append(tuple(layer_m))
        new_v.append(tuple(layer_v))
    return new_params, {"t": t, "m": new_m, "v": new_v}
