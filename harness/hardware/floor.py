"""The hardware floor of one training step: the least work a step of a spec needs, and from
a device's measured rates the lowest time per step that device allows.

Per step, counted from the spec alone (averaged over the schedule's batch sizes):
- flops: every matrix product as 2*m*n*k (forward, the weight gradients, and the input
  gradients of every layer but the first), plus one operation per element for each
  element-wise step (bias, activation and its derivative, loss and its gradient, the L2
  term, the optimizer update). A transcendental (tanh, exp) counts as one: a floor.
- bytes: the fewest a step must move: the batch's inputs, targets and row indices read
  once, the parameters and the optimizer state read and written once. An implementation
  that fused the whole step would move no more; activations would never leave the chip.
- unfused_bytes: what a layer-by-layer implementation adds: each layer's pre-activation,
  activation and their gradients written once and read once. Not part of the floor; it
  says when bandwidth is what an unfused framework is up against.
- launches: the fewest kernels a GPU step needs when each is a library product or one
  fused element-wise pass: per layer a forward product (bias and activation fused in), a
  weight-gradient product and a bias-gradient reduction; per layer but the first an
  input-gradient product (the activation derivative fused in); one loss-and-gradient
  kernel, one multi-tensor optimizer kernel, and one gather of the batch's rows when the
  batch is a shuffled subset: 4 per dense layer (each layer kind counts its own, Cost.launches)
  + 1 (+ 1).

floor = max(flops / matmul rate, bytes / bandwidth, launches * launch latency): each term
alone is a time no implementation can beat. On the CPU the launch term is zero (a compiled
loop launches nothing).
"""

from __future__ import annotations

from dataclasses import dataclass

from harness import layers, optimizers
from harness.core.registry import FLOAT32, RunKey
from harness.inputs.problem import Problem

BYTES = 4  # float32 values, int32 labels and row indices


def optimizer_ops(opt) -> tuple[int, int]:
    """An optimizer's float operations and state arrays per parameter, read and written
    besides the parameter: its kind's update rule (harness/optimizers/), a coupled decay (2),
    clipping's norm and scale (3)."""
    ops, states = optimizers.rule(opt).cost(opt)
    ops += 2 if opt.weight_decay and opt.coupled_decay else 0
    ops += 3 if opt.clip_global_norm is not None else 0
    return ops, states


@dataclass(frozen=True)
class StepCost:
    flops: float
    bytes: float
    unfused_bytes: float
    launches: int


@dataclass(frozen=True)
class Rates:
    """A device's measured rates, and how they were measured."""

    matmul_flops_per_s: float
    bandwidth_bytes_per_s: float
    launch_latency_s: float | None  # None on the CPU: nothing is launched
    measured_with: str


@dataclass(frozen=True)
class Floor:
    cost: StepCost
    rates: Rates
    compute_s: float
    memory_s: float
    launch_s: float

    @property
    def floor_s(self) -> float:
        return max(self.compute_s, self.memory_s, self.launch_s)

    @property
    def bound(self) -> str:
        """Which term sets the floor: arithmetic, bandwidth or launches."""
        terms = {"arithmetic": self.compute_s, "bandwidth": self.memory_s, "launches": self.launch_s}
        return max(terms, key=terms.get)


def mean_batch(problem: Problem) -> float:
    sizes = [stop - start for start, stop in problem.bounds]
    return sum(sizes) / len(sizes)


def step_cost(problem: Problem) -> StepCost:
    spec = problem.spec
    batch = mean_batch(problem)
    placed = spec.model.placed
    n_out = spec.model.n_outputs
    # Each layer kind names its own terms (harness/layers/*.py, cost): a dense or conv layer
    # its products (forward, weight gradient, and above the first layer the input gradient),
    # bias, activation, derivative and bias gradient; a pool its window reads; a norm its
    # statistics and their gradient.
    costs = layers.costs(placed)
    per_example = 0.0
    for cost in costs:
        per_example += cost.flops
    positions = spec.model.tokens.context if spec.model.tokens is not None else 1  # a text's: a loss term at each
    per_example += positions * n_out * (5 if spec.loss.kind == "mse" else 7)  # loss and its gradient (softmax for cross-entropy)

    weights = sum(c.weights for c in costs)
    params = sum(c.params for c in costs)
    ops, states = optimizer_ops(spec.optimizer)
    per_step = params * ops + (5 * weights if spec.loss.l2 else 0)

    target_width = n_out if spec.loss.kind == "mse" else positions
    shuffled = problem.batch_order is not None
    batch_bytes = batch * (spec.model.in_features + target_width + (1 if shuffled else 0)) * BYTES
    state_bytes = 2 * params * (1 + states) * BYTES
    fewest = batch_bytes + state_bytes + BYTES  # + the loss log's slot
    activations = sum(6 * batch * c.values * BYTES for c in costs)
    return StepCost(
        flops=batch * per_example + per_step,
        bytes=fewest,
        unfused_bytes=fewest + activations,
        launches=sum(c.launches for c in costs) + 1 + (1 if shuffled else 0),
    )


def floor(problem: Problem, rates: Rates) -> Floor:
    cost = step_cost(problem)
    return Floor(
        cost=cost,
        rates=rates,
        compute_s=cost.flops / rates.matmul_flops_per_s,
        memory_s=cost.bytes / rates.bandwidth_bytes_per_s,
        launch_s=cost.launches * (rates.launch_latency_s or 0.0),
    )


def floor_of(problem: Problem, key: RunKey, rates: dict[tuple[str, str], Rates] | None) -> Floor | None:
    """The floor of a run's step on its device: none for a float64 run (the floor counts
    float32 bytes and rates), for a port (its layers are its own code: no cost is counted)
    or where the device's rates were not measured."""
    measured = (rates or {}).get((key.device, key.precision))
    return None if measured is None or key.dtype != FLOAT32 or problem.port is not None else floor(problem, measured)
