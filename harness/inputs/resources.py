"""What a run will ask of the machine, estimated from its validated spec before anything
is made: memory (parameters, activations, data) and training steps. A spec past the limits
is refused with exit 2, unless --max-memory-gb or --max-steps raises them: a slip of a
width or an epoch count (1e9, 1e30), or a sweep value of 100,000 points per axis, should
not start a run that swaps the host to a halt or never ends.

The estimate counts what a run holds at once, in float64 (the oracle's width), to the
order of magnitude; it is a guard, not a prediction of a run's peak memory.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness import layers
from harness.core.errors import HarnessError
from harness.spec.load import LoadedSpec
from harness.spec.model import FULL_PROFILE, Spec, total_steps

GIB = 2**30
DEFAULT_MAX_MEMORY_GB = 8.0
DEFAULT_MAX_STEPS = 10_000_000
VALUE_BYTES = 8  # float64 values, int64 indices
PARAMETER_COPIES = 4  # the weights, their gradients, Adam's two moments
ACTIVATION_COPIES = 2  # each layer's values and their gradients


@dataclass(frozen=True)
class Limits:
    memory_gb: float = DEFAULT_MAX_MEMORY_GB
    steps: int = DEFAULT_MAX_STEPS


DEFAULT_LIMITS = Limits()


@dataclass(frozen=True)
class Estimate:
    parameter_bytes: int
    activation_bytes: int
    data_bytes: int
    steps: int

    @property
    def memory_bytes(self) -> int:
        return self.parameter_bytes + self.activation_bytes + self.data_bytes


def estimate(spec: Spec, n_examples: int) -> Estimate:
    """The memory and steps of training `spec` on `n_examples` training examples. The
    largest forward pass is the whole training set: the final metrics predict on it."""
    placed = spec.model.placed
    costs = layers.costs(placed)
    parameters = sum(c.params for c in costs)
    widths = [spec.model.in_features, *(c.values for c in costs)]  # one example's values going in and out of each layer
    steps = total_steps(spec.training, n_examples)
    training = spec.training
    has_order = training.shuffle or training.batch_size != "full"  # inputs.batch_order
    data = n_examples * (widths[0] + widths[-1]) + steps  # features, targets, the loss curve
    data += training.epochs * n_examples if has_order else 0  # one permutation per epoch
    rows = n_examples if training.batch_size == "full" else min(training.batch_size, n_examples)
    data += sum(steps * rows * c.values for p, c in zip(placed, costs) if p.module.KIND == "dropout")  # the masks
    return Estimate(
        parameter_bytes=PARAMETER_COPIES * parameters * VALUE_BYTES,
        activation_bytes=ACTIVATION_COPIES * n_examples * sum(widths) * VALUE_BYTES,
        data_bytes=data * VALUE_BYTES,
        steps=steps,
    )


def _count(n: int) -> str:
    return f"{n:,}" if n < 10**12 else f"about 10^{len(str(n)) - 1}"


def _gib(nbytes: int) -> str:
    return f"{nbytes / GIB:,.1f}" if nbytes < 10**15 else _count(nbytes // GIB)


def check(loaded: LoadedSpec, limits: Limits, n_examples: int | None = None) -> Estimate:
    """The estimate of `loaded` on `n_examples` (default: the spec's own count; an IDX
    data set's is unknown before its files are read, so 1, a lower bound); a HarnessError
    of one line when it is past `limits`."""
    spec = loaded.spec
    n = n_examples or spec.data.n_examples or 1
    found = estimate(spec, n)
    where = str(loaded.path) if loaded.profile == FULL_PROFILE else f"{loaded.path} (profile {loaded.profile})"
    if found.steps > limits.steps:
        raise HarnessError(
            f"{where}: training.epochs: {_count(found.steps)} training steps on {_count(n)} examples; "
            f"the limit is {limits.steps:,} (--max-steps raises it)"
        )
    if found.memory_bytes > limits.memory_gb * GIB:
        memory = _gib(found.memory_bytes)  # "about 10^17" already, or "about" is said here
        raise HarnessError(
            f"{where}: {memory if memory.startswith('about') else f'about {memory}'} GiB of memory for {_count(n)} examples (parameters "
            f"{_gib(found.parameter_bytes)}, activations {_gib(found.activation_bytes)}, data {_gib(found.data_bytes)} GiB); "
            f"the limit is {limits.memory_gb:g} GiB (--max-memory-gb raises it)"
        )
    return found
