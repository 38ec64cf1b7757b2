"""The calibration members' inputs: the plain problem with its sums in another order and
its intermediate values rounded once more, and the way back to the plain unit order."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from harness.inputs.problem import Params, Problem


def reordered(problem: Problem, seed: int) -> Problem:
    """The same training in exact arithmetic, rounded otherwise: its sums taken in another
    order (the hidden units in a seeded order, a layer's columns and the next layer's rows
    moving together, and each batch's examples in a seeded order), and over the first steps
    every intermediate array rounded once more, at random (jitter_seed). The output units
    and the probe rows stay where they are, so losses and outputs compare with the plain
    run's. A calibration member: rounding alone is all that changes.

    Why both: reordering alone moves a sum's rounding, but not the rounding of each term
    before it. Where a sum nearly cancels (a gradient over examples that pull both ways, a
    width-1 layer with nothing to reorder), an honest implementation that rounds each term
    otherwise (`2*d/n` against `d*(2/n)`) lands eps*sum|terms| away, far beyond eps*|sum|;
    the jitter makes the members land there too."""
    rng = np.random.default_rng(seed)
    params = [list(layer) for layer in problem.initial_params]
    orders = []
    for layer, above in zip(params, params[1:]):
        units = rng.permutation(layer[0].shape[1])
        layer[0], layer[1], above[0] = layer[0][:, units], layer[1][units], above[0][units]
        orders.append(units)
    moved = replace(problem, initial_params=[(w, b) for w, b in params], unit_orders=tuple(orders), jitter_seed=seed)
    if problem.batch_order is None:  # each step is the whole set in order: move the rows
        keep = min(problem.spec.checks.probe_size, len(problem.x_train))
        rows = np.concatenate([np.arange(keep), keep + rng.permutation(len(problem.x_train) - keep)])
        return replace(moved, x_train=problem.x_train[rows], y_train=problem.y_train[rows])
    order = problem.batch_order.copy()
    for start, stop in problem.bounds:
        order[:, start:stop] = rng.permuted(order[:, start:stop], axis=1)
    return replace(moved, batch_order=order)


def in_plain_order(params: Params, unit_orders: tuple[np.ndarray, ...]) -> Params:
    """A reordered member's parameters mapped back to the plain problem's unit order, so that
    they compare tensor by tensor with any other run's (the inverse of reordered)."""
    params = [list(layer) for layer in params]
    for layer, above, units in zip(params, params[1:], unit_orders):
        back = np.argsort(units)
        layer[0], layer[1], above[0] = layer[0][:, back], layer[1][back], above[0][back]
    return [(w, b) for w, b in params]
