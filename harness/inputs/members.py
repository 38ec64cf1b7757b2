"""The calibration members' inputs: the plain problem with its sums in another order and
its intermediate values rounded once more, and the way back to the plain unit order."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from harness.inputs.problem import Params, Problem
from harness.layers import Placed

# A member's order of one layer's units (new unit j is plain unit order[j]) and every
# (tensor, axis) it moves: the layer's outputs, the per-channel layers after it, and the
# next layer's inputs.
UnitOrder = tuple[np.ndarray, tuple[tuple[str, int], ...]]
# Layers that act on each channel (or feature) alone: a permutation of the channels passes
# through them, their own per-channel tensors moving with it.
PER_CHANNEL = ("max_pool", "avg_pool", "batch_norm")
# The axis of a producer's outputs and of a consumer's inputs in its weight.
OUT_AXIS = {"dense": 1, "conv2d": 0}
IN_AXIS = {"dense": 0, "conv2d": 1}


def unit_moves(placed: list[Placed]) -> list[tuple[int, tuple[tuple[str, int], ...]]]:
    """The layers whose units a member may reorder, with their count and the tensors that
    move: a dense (conv) layer followed, through per-channel layers only, by another dense
    (conv) layer. In an MLP: every layer but the last."""
    found = []
    for i, p in enumerate(placed):
        kind = p.module.KIND
        if kind not in OUT_AXIS:
            continue
        moves = [(f"{p.name}.weight", OUT_AXIS[kind]), (f"{p.name}.bias", 0)]
        j = i + 1
        while j < len(placed) and placed[j].module.KIND in PER_CHANNEL:
            moves += [(f"{placed[j].name}.{local}", 0) for local in placed[j].local_names]
            j += 1
        if j < len(placed) and placed[j].module.KIND == kind:
            moves.append((f"{placed[j].name}.weight", IN_AXIS[kind]))
            # a conv's channels lead its output; a dense layer's units end it (a text's
            # dense acts on the last axis of (positions, width))
            found.append((p.out_shape[0] if kind == "conv2d" else p.out_shape[-1], tuple(moves)))
    return found


def _unit_orders(rng: np.random.Generator, spec) -> tuple:
    """Each hidden layer's order of its units (the first draws of a member's generator)."""
    return tuple((rng.permutation(units), moves) for units, moves in unit_moves(spec.model.placed))


def unit_orders(spec, seed: int) -> tuple:
    """The unit orders of the member `reordered(problem, seed)` makes of any problem of
    `spec`, without making it (the driver puts a member's outcome back in plain units)."""
    return _unit_orders(np.random.default_rng(seed), spec)


def reordered(problem: Problem, seed: int) -> Problem:
    """The same training in exact arithmetic, rounded otherwise: its sums taken in another
    order (the hidden units and channels in a seeded order, a layer's outputs and the next
    layer's inputs moving together, and each batch's examples in a seeded order, their
    dropout masks with them), and over the first steps every intermediate array rounded
    once more, at random (jitter_seed). The output units and the probe rows stay where they
    are, so losses and outputs compare with the plain run's. A calibration member: rounding
    alone is all that changes.

    Why both: reordering alone moves a sum's rounding, but not the rounding of each term
    before it. Where a sum nearly cancels (a gradient over examples that pull both ways, a
    width-1 layer with nothing to reorder), an honest implementation that rounds each term
    otherwise (`2*d/n` against `d*(2/n)`) lands eps*sum|terms| away, far beyond eps*|sum|;
    the jitter makes the members land there too. The layers other than dense also take
    their long sums over the batch and the pixels (batch and layer norm's statistics, a
    convolution's gradients) in a seeded order over those steps (network.Context.reorder):
    a batch that cannot be reordered (the whole set, all of it probe rows) still sums them
    otherwise, as another library would."""
    rng = np.random.default_rng(seed)
    orders = _unit_orders(rng, problem.spec)
    params = dict(problem.initial_params)
    for order, moves in orders:
        for name, axis in moves:
            params[name] = np.take(params[name], order, axis=axis)
    moved = replace(problem, initial_params=params, unit_orders=orders, jitter_seed=seed)
    if problem.batch_order is None:  # each step is the whole set in order: move the rows
        keep = min(problem.spec.checks.probe_size, len(problem.x_train))
        rows = np.concatenate([np.arange(keep), keep + rng.permutation(len(problem.x_train) - keep)])
        masks = {name: kept[:, rows] for name, kept in problem.masks.items()}
        return replace(moved, x_train=problem.x_train[rows], y_train=problem.y_train[rows], masks=masks)
    order = problem.batch_order.copy()
    if not problem.masks:  # the draws every member has always taken: an MLP's members stay the same bits
        for start, stop in problem.bounds:
            order[:, start:stop] = rng.permuted(order[:, start:stop], axis=1)
        return replace(moved, batch_order=order)
    masks = {name: kept.copy() for name, kept in problem.masks.items()}
    for epoch in range(len(order)):
        for k, (start, stop) in enumerate(problem.bounds):
            perm = rng.permutation(stop - start)
            order[epoch, start:stop] = order[epoch, start + perm]
            t = epoch * len(problem.bounds) + k
            for kept in masks.values():
                if t < len(kept):
                    kept[t, : stop - start] = kept[t, perm]
    return replace(moved, batch_order=order, masks=masks)


def in_member_order(state: Params, unit_orders: tuple[UnitOrder, ...]) -> Params:
    """A training state in the plain unit order (its tensors and the optimizer's moments of
    each, harness.reference.network.training_state) moved into a member's order, as
    reordered moves the initial tensors."""
    state = dict(state)
    for order, moves in unit_orders:
        for name, axis in moves:
            for key in [k for k in state if k.rsplit("/", 1)[-1] == name]:
                state[key] = np.take(state[key], order, axis=axis)
    return state


def in_plain_order(params: Params, unit_orders: tuple[UnitOrder, ...]) -> Params:
    """A reordered member's tensors mapped back to the plain problem's unit order, so that
    they compare tensor by tensor with any other run's (the inverse of reordered)."""
    params = dict(params)
    for order, moves in unit_orders:
        back = np.argsort(order)
        for name, axis in moves:
            for key in [k for k in params if k.rsplit("/", 1)[-1] == name]:  # its optimizer moments too
                params[key] = np.take(params[key], back, axis=axis)
    return params
