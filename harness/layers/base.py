"""What every layer kind shares: the context of a forward or backward pass, a step's cost
for the floor, and the weight initialisations of the spec's `init` section."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

Array = Any
Shape = tuple[int, ...]  # one example's shape: (features,), (channels, height, width) or (positions, width)


def plain(a: Array, ulps: float = 1.0) -> Array:
    return a


# From this many sums at once, a running sum is taken as one NumPy reduction over the terms'
# axis held outermost (one sum per column, each added term after term: cumsum's last value,
# bit for bit) rather than as a cumulative sum whose every partial sum is written out; below
# it the cumulative sum is faster (its inner loop runs over the terms). A single sum is
# always the cumulative one: NumPy sums one contiguous row pairwise. (issue 54: the members'
# batch and layer norms, attention's softmax, convolution biases; docs/measurements.md)
COLUMNS_AT_ONCE = 16


def running_sum(xp, terms: Array, order: Array) -> Array:
    """terms[..., order[0]] + terms[..., order[1]] + ... over the last axis, added one after
    another in that order (a serial loop's rounding, not a pairwise one), for every index of
    the other axes. On CuPy, the cumulative sum (CuPy computes its scan in an order of its own)."""
    kept, n = terms.shape[:-1], terms.shape[-1]
    count = math.prod(kept)
    if xp is not np or count < COLUMNS_AT_ONCE:
        return xp.cumsum(xp.take(terms, order, axis=-1), axis=-1)[..., -1]
    rows = xp.take(xp.moveaxis(terms, -1, 0).reshape(n, count), order, axis=0)  # (n, count), one row per term
    return rows.sum(axis=0).reshape(kept)


@dataclass
class Context:
    """A pass through the network: training (batch statistics, dropout masks) or evaluation
    (running statistics, no dropout); the extra rounding of a calibration member (jitter);
    the L2 penalty's multiplier of sum(W^2); this step's dropout mask of each layer (by its
    name); and, written by the forward pass, the new running statistics (by tensor name)."""

    train: bool = True
    jitter: Callable[[Array], Array] = plain
    l2_scale: float = 0.0
    masks: dict[str, Array] = field(default_factory=dict)
    updates: dict[str, Array] = field(default_factory=dict)
    layer: str = ""  # the name of the layer being passed (a dropout layer finds its mask by it)
    # A calibration member's other summation orders (None: the plain ones): the layers other
    # than dense take their long sums (batch norm's statistics, layer norm's, a convolution's
    # gradients over the batch and the pixels) over their terms in a seeded order.
    reorder: np.random.Generator | None = None
    # The logged loss summed one example after another (a library's few partial sums,
    # harness/known_differences.yaml `loss_sum`); its gradient is unchanged.
    sequential_loss: bool = False
    # A calibration member's gradient of a label-smoothed loss, over its whole run: through
    # the log-softmax's backward as autodiff takes it (harness/reference/network.py data_loss).
    autodiff_loss: bool = False
    # A residual's input, kept where its body starts until the residual adds it (by the
    # residual's name); going back, the residual's gradient until the body's start adds it.
    skips: dict[str, Array] = field(default_factory=dict)
    skip_grads: dict[str, Array] = field(default_factory=dict)
    # A bf16 run's pass (harness/reference/autocast.py Autocast): values rounded to bfloat16
    # where torch's autocast computes them in bfloat16; None in every other run.
    autocast: Any = None

    def total(self, xp, a: Array, axis: int) -> Array:
        """a summed over `axis`. Everyone but a calibration member sums pairwise: the terms
        are moved to a contiguous last axis first, where NumPy's sum is pairwise (along
        another axis, or over several, it adds one term after the other: 40 times further
        from the exact sum on batch norm's 12,544 terms than XLA's). A calibration member
        adds its terms one after the other in a seeded order (a running sum, as a serial
        loop or Welford's update does): another honest rounding, and a coarser one, so that
        the members span what libraries do."""
        terms = xp.moveaxis(a, axis, -1)
        if self.reorder is None:
            return xp.ascontiguousarray(terms).sum(axis=-1)
        return running_sum(xp, terms, xp.asarray(self.reorder.permutation(terms.shape[-1])))

    def sum(self, xp, a: Array, axes: tuple[int, ...]) -> Array:
        """The sum over `axes` (the rest kept, in order), summed as `total` sums."""
        kept = [i for i in range(a.ndim) if i not in axes]
        flat = xp.moveaxis(a, kept, list(range(len(kept)))).reshape(*(a.shape[i] for i in kept), -1)
        return self.total(xp, flat, flat.ndim - 1)

    def mean(self, xp, a: Array, axes: tuple[int, ...]) -> Array:
        count = int(np.prod([a.shape[i] for i in axes]))
        return self.sum(xp, a, axes) / count


@dataclass(frozen=True)
class Cost:
    """One example's share of a training step, in float operations, and the values a layer
    writes (its activations): the floor's terms (harness/hardware/floor.py)."""

    flops: float  # forward, backward and the layer's own element-wise work, per example
    values: int  # one example's output values
    params: int = 0  # trained values
    weights: int = 0  # of which weights (an L2 penalty's terms)
    launches: int = 2  # kernels per step, forward and backward


def draw_weight(rng: np.random.RandomState, scheme: str, shape: Shape, fan_in: int, fan_out: int) -> np.ndarray:
    """A weight of `shape` by the spec's scheme (glorot_uniform, normal_over_sqrt_fan_in,
    torch_linear_default), with the fans torch and flax compute."""
    if scheme == "glorot_uniform":
        limit = np.sqrt(6.0 / (fan_in + fan_out))
        return rng.uniform(-limit, limit, size=shape)
    if scheme == "normal_over_sqrt_fan_in":
        return rng.randn(*shape) / np.sqrt(fan_in)
    bound = 1.0 / np.sqrt(fan_in)  # torch_linear_default: kaiming_uniform(a=sqrt(5))
    return rng.uniform(-bound, bound, size=shape)


def draw_bias(rng: np.random.RandomState, scheme: str, size: int, fan_in: int) -> np.ndarray:
    if scheme == "zeros":
        return np.zeros(size)
    bound = 1.0 / np.sqrt(fan_in)
    return rng.uniform(-bound, bound, size=size)


def features(shape: Shape) -> int:
    return int(np.prod(shape))


# The parts of a layer that keeps its input's shape and has no tensors (dropout, residual):
# its out_shape, its init and its cost, one operation a value each way.
def same_shape(section, shape: Shape) -> Shape:
    return shape


def no_tensors(section, shape, rng, scheme) -> dict[str, np.ndarray]:
    return {}


def elementwise_cost(section, shape: Shape, first: bool) -> Cost:
    values = features(shape)
    return Cost(flops=2 * values, values=values)
