"""The adapter contract, typed: what the runner calls on each framework's module. `Adapter`
is what every adapter has; each optional capability is a Protocol of its own, checked where
it is used (`isinstance(adapter, LoadsState)`), never by a name looked up by hand.
`tests/test_adapters.py` checks every registered adapter against them, name by name and
parameter by parameter.

Every function that sets a run up takes the run's `RunKey` (harness/core/registry.py): its
device, dtype, precision ("strict": full float32 products, deterministic kernels; "tf32":
TF32 allowed on the GPU; "float64": the float64 twin) and mode ("eager": the article-style
code, one framework call per step; "fast": the framework's compiled mode, many steps per
call, fused kernels, graphs) come from there, never from a module global. Framework imports
happen inside the functions, never when harness imports the module."""

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
    """One framework's module (NAME: its name in harness/core/registry.py ADAPTERS)."""

    NAME: str

    def unavailable(self, key: RunKey) -> str | None:
        """Why it cannot run there, or None."""

    def describe(self, key: RunKey) -> dict[str, Any]:
        """Library, version, device name, math mode, threads; for the fast mode what it does
        (`fast_mode`: one line)."""

    def put(self, problem: Problem, key: RunKey) -> Any:
        """The training data on the device (timed as transfer): `problem.host_arrays`."""

    def build(self, problem: Problem, data: Any, key: RunKey) -> Any:
        """A trainer holding the initial weights (`problem.initial_params`, NumPy, dense
        weights stored (fan_in, fan_out)) and the optimizer state, the key's precision applied."""

    def warm_up(self, trainer: Any, plan: Sequence[tuple[int, int]] = ()) -> None:
        """Compile and warm kernels for every (start, stop) range of `plan` (the ranges
        `train` will be called with), without changing the state."""

    def train(self, trainer: Any, start: int, stop: int) -> None:
        """The optimizer steps start .. stop - 1, each on its own batch; each step's batch
        loss before the update goes into a loss log kept on the device (preallocated: no
        per-step objects pile up, no host sync)."""

    def synchronize(self, trainer: Any) -> None:
        """Wait for the device."""

    def state(self, trainer: Any, upto: int) -> State:
        """The first `upto` logged losses and every tensor, as NumPy arrays."""

    def predict(self, trainer: Any, x: np.ndarray) -> np.ndarray:
        """The outputs in evaluation (running statistics, no dropout), as a NumPy array."""


@runtime_checkable
class LoadsState(Protocol):
    """Optional: go on from a training state after `step` updates, as a checkpoint restores
    one (the re-anchored runs, harness/run/anchored.py)."""

    def load_state(self, trainer: Any, state: Params, step: int) -> None: ...


@runtime_checkable
class BuildsAgain(Protocol):
    """Optional: a fresh trainer of another's problem, data and key, as `build` makes one, that
    reuses what the other compiled (a twin's re-anchored segments, harness/run/anchored.py:
    one compile, not one a segment)."""

    def build_again(self, trainer: Any) -> Any: ...


@runtime_checkable
class KeepsTrainingState(Protocol):
    """Optional: the whole training state by name, optimizer moments included (`m/<tensor>`,
    harness.reference.network.training_state), to start the re-anchored runs from."""

    def training_state(self, trainer: Any) -> Params: ...


@runtime_checkable
class RecordsLayerOutputs(Protocol):
    """Optional: every layer's output on a batch, by layer name, for the diagnosis to name
    the first layer whose float64 output differs."""

    def layer_outputs(self, trainer: Any, x: np.ndarray, masks: dict) -> Params: ...


@runtime_checkable
class RecordsComputedIn(Protocol):
    """Optional: the dtype each layer's output and the loss are computed in on step 0's
    batch, by layer name and "loss", and the lowest its parameters and its optimizer's state
    are held in ("parameters", "optimizer state"), for a bf16 run's diagnosis to name what it
    computes in bfloat16 where torch's autocast keeps float32 (a port: those two alone)."""

    def computed_in(self, trainer: Any) -> dict[str, str]: ...


@runtime_checkable
class MeasuresRates(Protocol):
    """Optional: the device's float32 product rate, memory bandwidth and (GPU) the cost of
    one kernel in a CUDA graph, for the floor (harness/hardware/rates.py). Keys: "matmul"
    (FLOP/s), "bandwidth" (B/s), "launch" (s)."""

    def rates(self, device: str, precision: str) -> dict[str, float]: ...


@runtime_checkable
class ComputesScheduleRates(Protocol):
    """Optional: the learning rate of every update as the library's own schedule computes
    it, where that differs from the spec's (harness/known_differences.yaml `rates`)."""

    def schedule_rates(self, opt: Any, steps: int) -> list[float]: ...


@runtime_checkable
class MeasuresDefects(Protocol):
    """Optional: the catalogued library defects (harness/library_defects.yaml) a float32
    run's step meets on its device, each measured: {"defect": id, "op": where it is,
    "error": its float32 value's distance from its float64 value, relative}, and the op's
    own keys. The diagnosis names them on the run's failing checks."""

    def defects(self, trainer: Any) -> list[dict[str, Any]]: ...


CAPABILITIES = (LoadsState, BuildsAgain, KeepsTrainingState, RecordsLayerOutputs, MeasuresRates, ComputesScheduleRates, MeasuresDefects)
