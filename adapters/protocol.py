"""The adapter protocol, typed: what the runner calls on each framework's module
(adapters/__init__.py says what each function must do). `tests/test_adapters.py` checks
every registered adapter against it, name by name and parameter by parameter.

Every function that sets a run up takes the run's `RunKey`: its device, dtype, precision
("strict", "tf32", "float64") and mode come from there, never from a module global."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    from harness.core.registry import RunKey
    from harness.inputs.problem import Problem

Params = dict[str, np.ndarray]  # every tensor by name, in the spec's layout (harness/inputs/problem.py)


class State(NamedTuple):
    """A trainer's results so far, as float64 NumPy arrays (parameters in their own dtype)."""

    losses: np.ndarray  # the first `upto` logged losses
    params: Params  # every tensor by name (running statistics too), in the spec's layout


@runtime_checkable
class Adapter(Protocol):
    NAME: str

    def unavailable(self, key: RunKey) -> str | None: ...

    def describe(self, key: RunKey) -> dict[str, Any]: ...

    def put(self, problem: Problem, key: RunKey) -> Any: ...

    def build(self, problem: Problem, data: Any, key: RunKey) -> Any: ...

    def warm_up(self, trainer: Any, plan: Sequence[tuple[int, int]] = ()) -> None: ...

    def train(self, trainer: Any, start: int, stop: int) -> None: ...

    def synchronize(self, trainer: Any) -> None: ...

    def state(self, trainer: Any, upto: int) -> State: ...

    def predict(self, trainer: Any, x: np.ndarray) -> np.ndarray: ...

    def load_state(self, trainer: Any, state: Params, step: int) -> None: ...


class KeepsTrainingState(Protocol):
    """Optional (the oracle's adapter): the whole training state by name, to start the
    re-anchored twins from (harness.reference.network.training_state)."""

    def training_state(self, trainer: Any) -> Params: ...


class MeasuresRates(Protocol):
    """Optional: an adapter that can time its device's float32 product rate, memory
    bandwidth and (GPU) the cost of one kernel in a CUDA graph, for the floor
    (harness/run/hardware.py). Keys: "matmul" (FLOP/s), "bandwidth" (B/s), "launch" (s)."""

    def rates(self, device: str, precision: str) -> dict[str, float]: ...
