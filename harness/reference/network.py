"""The network written once against an array module `xp` (NumPy or CuPy): forward through
the layer registry's modules (harness/layers/), the loss, the hand-written backward pass,
and the optimizer updates. Parameters and state are one flat mapping from names such as
`dense1.weight`, `conv1.weight`, `bn1.running_mean` to arrays, in the spec's layout.

Bound to NumPy in float64 it is the reference oracle; bound to NumPy in float32 it is the
NumPy adapter's eager path; bound to CuPy it runs on the GPU. It imports no framework.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from harness import optimizers
from harness.core import threads
from harness.layers import ACTIVATED, Placed, residual_starts
from harness.layers.activations import activate, activation_grad
from harness.layers.base import Context, plain

Array = Any
Jitter = Callable[[Array], Array]
Params = dict[str, Array]

__all__ = ["Context", "plain", "activate", "activation_grad"]


# A member's move is a + a*u, u uniform over MOVE_LEVELS values spread evenly across
# [-eps, eps] (eps times `ulps`): one random byte per element, drawn 8 to a 64-bit word of the
# bit generator and turned into u with two passes. The rounding of a + a*u lands on one of
# the five floats within two ulps of a, and 256 levels move each of their chances by less
# than 1/256 from a continuous u's; NumPy's float64 uniform draws cost 3.4 ms per 800,000
# elements against 0.3 ms for these bytes, most of a member's extra rounding (issue 54:
# 57% of a gpl_transformer member, 2026-11-29).
MOVE_LEVELS = 256
_MIDDLE = (MOVE_LEVELS - 1) / 2


def move_bytes(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """One random byte per element of an array of `shape` (uint8, writable), from `rng`'s
    bit generator: the draws a member's moves are made of (`moves`)."""
    n = math.prod(shape)
    return rng.bit_generator.random_raw(-(-n // 8)).view(np.uint8)[:n].reshape(shape)


def moves(b, eps: float):
    """u in [-eps, eps] from the random bytes `b`, in the float dtype of the array module's
    `b.astype` the caller passes: (b - 127.5) * eps / 127.5, both exact or one rounding; the
    lowest and highest levels are -eps and eps, none is 0."""
    b -= _MIDDLE
    b *= eps / _MIDDLE
    return b


# A NumPy array of at least BLOCKED_BYTES is moved a block of BLOCK_BYTES at a time, its five
# passes (the bytes' cast, two for u, u*a, +a) over one block while it sits in the core's
# cache, into one output allocated once: the same operations on each element, so the same
# bits (tests/test_inputs.py). Measured (docs/measurements.md, 2026-12-03): 0.5-0.6x the
# time of whole-array passes from 4 MB up (a float64 moons_net layer of 1,000 x 1,000: 5.6
# against 2.8 ms), slower below it.
BLOCKED_BYTES = 4 << 20
BLOCK_BYTES = 512 << 10


def _moved(u: Array, a: Array, eps: float) -> Array:
    """a + a*u in u's own memory, u holding the bytes cast to a's dtype: the same two
    roundings (u*a, then that + a), without a float64 member's copy of the draws and its two
    temporaries (issue 54: 2.2 s of a 14 s member of moons_net went to copies)."""
    u = moves(u, eps)
    u *= a
    u += a
    return u


def _moved_in_blocks(a: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    """a + a*moves(b, eps), computed block by block into a new array (a, b C-contiguous)."""
    out = np.empty_like(a)
    flat_a, flat_b, flat_out = a.reshape(-1), b.reshape(-1), out.reshape(-1)
    step = BLOCK_BYTES // a.itemsize
    for start in range(0, flat_a.size, step):
        u = flat_out[start : start + step]
        np.copyto(u, flat_b[start : start + step], casting="unsafe")  # astype's exact cast
        _moved(u, flat_a[start : start + step], eps)
    return out


def jitter_function(xp, seed: int) -> Jitter:
    """Each call moves every element of an array, at random, by at most two units in its
    last place (a + a*u rounded, u uniform over MOVE_LEVELS values in [-eps, eps], seeded;
    the sign kept, zero kept): another honest rounding of every value, as an implementation
    computing it by another formula would give; `ulps` times further for a function whose
    libraries round it that much worse (harness/layers/activations.py). The calibration
    members (harness.inputs.members.reordered) run with it over their first steps."""
    rng = np.random.default_rng(seed)

    def jitter(a: Array, ulps: float = 1.0) -> Array:
        eps = float(xp.finfo(a.dtype).eps) * ulps
        if xp is np and isinstance(a, np.ndarray) and a.nbytes >= BLOCKED_BYTES and a.flags.c_contiguous and a.dtype.kind == "f":
            return _moved_in_blocks(a, move_bytes(rng, a.shape), eps)
        u = xp.asarray(move_bytes(rng, a.shape)).astype(a.dtype)
        if u.ndim == 0:
            return a + a * moves(u, eps)
        return _moved(u, a, eps)

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
    jitter, cast = ctx.jitter, ctx.autocast
    a = x.reshape((x.shape[0], *placed[0].in_shape)) if len(placed[0].in_shape) > 1 else x
    caches = []
    starts = residual_starts(placed)
    for p in placed:
        for name in starts.get(p.index, ()):  # a residual's input, kept until it adds it
            ctx.skips[name] = a
            if cast is not None:
                cast.skips[name] = cast.last
        ctx.layer = p.name
        local, kept = _local(p, params), plain
        if cast is not None:  # a bf16 pass: its inputs, and each output rounded (harness/reference/autocast.py)
            local, a = cast.enter(p, local, a, ctx.train)
            kept = functools.partial(cast.out, p)
        out, cache = p.module.forward(xp, p.section, local, a, ctx)
        for name in [k for k in ctx.updates if "." not in k]:
            ctx.updates[f"{p.name}.{name}"] = ctx.updates.pop(name)
        if p.activation is not None:
            z = kept(jitter(out))
            a = kept(jitter(activate(xp, z, p.activation, jitter)))
            caches.append((cache, z, a))
        else:
            a = kept(jitter(out))
            caches.append((cache, None, a))
        if outputs is not None:
            outputs[p.name] = a
    return a, caches


def log_softmax(xp, logits: Array, jitter: Jitter = plain) -> Array:
    """z - max - log(sum(exp(z - max))), as torch computes it. A calibration member
    (`jitter`) computes it as z - lse, lse = max + log(sum) rounded at its own size, as
    jax.nn.logsumexp and optax do: where the label's logit is the largest and the loss
    nears 0, lse - z cancels, and its rounding is a few ulps of the logit, not of the loss
    (an honest float64 JAX was 2x the calibrated loss curve's tolerance on members that
    rounded the loss at its own size only)."""
    top = logits.max(axis=1, keepdims=True)
    shifted = logits - top
    log_sum = xp.log(jitter(threads.unary(xp, xp.exp, shifted).sum(axis=1, keepdims=True)))
    if jitter is plain:
        return shifted - log_sum
    return logits - jitter(top + log_sum)


def l2_scale(loss_section, n_examples: int) -> float:
    """The multiplier of sum(W^2): lambda/2, divided by N when the spec says so."""
    l2 = loss_section.l2
    if l2 is None:
        return 0.0
    return l2.coefficient / 2 / (n_examples if l2.divide_by_examples else 1)


def _summed(xp, terms: Array, sequential: bool) -> Array:
    """The sum of a loss's terms, or with `sequential` their per-example sums added one
    example after another (a library's fewest partial sums)."""
    if sequential:
        return xp.cumsum(terms.reshape(len(terms), -1).sum(axis=1))[-1]
    return terms.sum()


def data_loss(
    xp, outputs: Array, targets: Array, loss_section, jitter: Jitter = plain, sequential: bool = False, autodiff: bool = False
) -> tuple[Array, Array]:
    """The data term of the loss and its gradient with respect to the outputs; with
    `sequential`, the loss's terms summed one example after another (its gradient alike);
    with `autodiff` (a calibration member, over its whole run), a label-smoothed loss's
    gradient as torch's and JAX's autodiff take it (below). Outputs (batch, positions,
    classes), a text's, are (batch * positions) rows, each position's target its own: the
    mean is over every position of every example (torch's cross_entropy of the flattened
    logits)."""
    if outputs.ndim == 3:
        loss, d_out = data_loss(xp, outputs.reshape(-1, outputs.shape[-1]), targets.reshape(-1), loss_section, jitter, sequential, autodiff)
        return loss, d_out.reshape(outputs.shape)
    n = outputs.shape[0]
    if loss_section.kind == "mse":
        diff = outputs - targets
        total = _summed(xp, diff * diff, sequential)
        d_out = 2 * diff
        denom = diff.size if loss_section.reduction == "mean" else 1
    else:
        logp = log_softmax(xp, outputs, jitter)
        rows = xp.arange(n)
        smoothing = loss_section.label_smoothing
        if smoothing:  # the targets (1 - s) * one_hot + s / K
            off, on = smoothing / outputs.shape[1], 1 - smoothing
            if jitter is not plain:
                # A member rounds the two constants once more, every row alike: the rows of
                # torch's and optax's targets (their gradients through the log-softmax, p *
                # sum(q) - q) sum to 1 + delta, delta a rounding of those constants shared
                # by every row, which shifts a gradient summed over the batch 25-40x
                # further than rounding each row on its own does.
                off, on = (jitter(xp.asarray(c, dtype=outputs.dtype)) for c in (off, on))
            q = xp.full(outputs.shape, off, dtype=outputs.dtype)
            q[rows, targets] += on
            total = _summed(xp, -(q * logp), sequential)  # negation is exact: the same bits as -(sum)
            if autodiff:
                # torch's and JAX's autodiff take the gradient through the log-softmax's
                # backward, g - p * sum(g) with g = -q: p * sum(q) - q, where sum(q) is the
                # rounded sum of the rounded targets, 1 + delta, the same in every row and on
                # every step. Exactly p - q, but the softmax scaled by 1 + delta on every step
                # drifts a long run systematically: both libraries' float32 runs of an AdamW
                # MNIST recipe ended 7x beyond members computing p - q (issue 56).
                d_out = jitter(threads.unary(xp, xp.exp, logp)) * jitter(q.sum(axis=1, keepdims=True)) - q
            else:
                d_out = jitter(threads.unary(xp, xp.exp, logp)) - q
        else:
            total = _summed(xp, -logp[rows, targets], sequential)
            d_out = jitter(threads.unary(xp, xp.exp, logp))
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
    loss, d_a = data_loss(xp, outputs, targets, loss_section, jitter, ctx.sequential_loss, ctx.autodiff_loss)
    d_a = jitter(d_a)
    cast = ctx.autocast
    if cast is not None and cast.last:  # the loss's gradient back into bfloat16 logits
        d_a = cast.low(d_a)
    found: dict[str, Array] = {}
    starts = residual_starts(placed)
    for i in reversed(range(len(placed))):
        p = placed[i]
        cache, z, a_out = caches[i]
        ctx.layer = p.name
        local = _local(p, params)
        if p.activation is not None:
            d_a = jitter(d_a * activation_grad(xp, z, a_out, p.activation, jitter))
            d_a = d_a if cast is None else cast.out(p, d_a)
        if cast is not None:
            local = cast.params(p, local)
        d_a, grads = p.module.backward(xp, p.section, local, cache, d_a, ctx, i > 0)
        if cast is not None:
            d_a, grads = cast.back(p, d_a, grads)
        found.update({f"{p.name}.{k}": g for k, g in grads.items()})
        for name in starts.get(i, ()):  # past a residual's body: its gradient of the input added
            skipped = ctx.skip_grads.pop(name)
            d_a = None if d_a is None else jitter(d_a + skipped)
            if cast is not None and d_a is not None and cast.skips[name]:
                d_a = cast.low(d_a)
    if ctx.l2_scale:
        loss = loss + ctx.l2_scale * sum((w * w).sum() for w in weights(placed, params))
    return loss, {name: found[name] for name in trained_names(placed)}, ctx.updates


# A training's whole state as one mapping (what a re-anchored twin starts from,
# harness/run/anchored.py): every tensor by its name, and the optimizer's state of each
# trained tensor as MOMENT/name: Adam's moments m and v, SGD's momentum buffer. The update
# count is the step the state was taken at.
MOMENTS = {"m": "m", "v": "v", "momentum": "buf"}


def training_state(params: Params, opt_state) -> Params:
    """The flat state of the oracle's tensors and optimizer state (both on the host)."""
    found = dict(params)
    for moment, field in MOMENTS.items():
        found.update({f"{moment}/{name}": a for name, a in opt_state.get(field, {}).items()})
    return found


def split_training_state(state: Params) -> tuple[Params, dict[str, Params]]:
    """The tensors, and each optimizer moment's tensors by name (the inverse of training_state)."""
    params = {k: a for k, a in state.items() if "/" not in k}
    moments: dict[str, Params] = {}
    for key, a in state.items():
        if "/" in key:
            moment, name = key.split("/", 1)
            moments.setdefault(moment, {})[name] = a
    return params, moments


def optimizer_state(opt, step: int, moments: dict[str, Params]):
    """The oracle's optimizer state after `step` updates, from a state's moments."""
    return optimizers.rule(opt).state_at(opt, step, moments)


def optimizer_init(xp, opt, params: Params, names: list[str]):
    """The optimizer's state before the first update (its kind's init)."""
    return optimizers.rule(opt).init(xp, opt, params, names)


def recipe_gradients(xp, params: Params, grads: Params, opt, jitter: Jitter = plain, clip_eps: float = 0.0) -> Params:
    """The gradient the update rule takes (harness/optimizers/recipe.py): clipped to the
    global norm, then with the coupled weight decay added. With `clip_eps`, the clipping
    is a library's instead (torch's clip_grad_norm_: max_norm / (norm + eps), at most 1, on
    every step; harness/known_differences.yaml)."""
    if opt.clip_global_norm is not None:
        norm = jitter(xp.sqrt(sum((g * g).sum() for g in grads.values())))
        if clip_eps:
            factor = min(opt.clip_global_norm / (norm + clip_eps), 1.0)
            grads = {name: jitter(g * factor) for name, g in grads.items()}
        elif norm > opt.clip_global_norm:
            grads = {name: jitter(g / norm * opt.clip_global_norm) for name, g in grads.items()}
    if opt.weight_decay and opt.coupled_decay:
        grads = {name: jitter(g + opt.weight_decay * params[name]) for name, g in grads.items()}
    return grads


def train_step(
    xp,
    placed: list[Placed],
    params: Params,
    opt_state,
    x: Array,
    targets: Array,
    spec,
    n_examples: int,
    ctx: Context,
    clip_eps: float = 0.0,
    rates: tuple[float, ...] | None = None,
    corrections=None,
):
    """One optimizer step of the spec: the loss before it, the parameters and running
    statistics after it, and the optimizer state. A library's behaviour instead of the
    spec's (harness/inputs/library.py library_problem): `clip_eps` (see recipe_gradients), `rates`
    (the learning rate of update t is rates[t]), `corrections` (Adam's bias corrections, if
    not its update's own)."""
    loss, grads, updates = loss_and_grads(xp, placed, params, x, targets, spec.loss, n_examples, ctx)
    opt = spec.optimizer
    grads = recipe_gradients(xp, params, grads, opt, ctx.jitter, clip_eps)
    lr = opt.lr_at(opt_state["t"]) if rates is None else rates[opt_state["t"]]
    library = {} if corrections is None else {"corrections": corrections}
    params, opt_state = optimizers.rule(opt).update(xp, params, grads, opt_state, opt, lr, jitter=ctx.jitter, **library)
    return loss, {**params, **updates}, opt_state


def predict(xp, placed: list[Placed], params: Params, x: Array, jitter: Jitter = plain, autocast=None) -> Array:
    """Outputs in evaluation: running statistics, no dropout; `autocast` a bf16 run's
    rounding (harness/reference/autocast.py Autocast), a fresh one."""
    outputs, _ = forward(xp, placed, params, x, Context(train=False, jitter=jitter, autocast=autocast))
    return outputs
