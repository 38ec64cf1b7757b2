"""The adapter protocol, typed: what the runner calls on each framework's module
(adapters/__init__.py says what each function must do). `tests/test_adapters.py` checks
every registered adapter against it, name by name and parameter by parameter."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

Params = list[tuple[np.ndarray, np.ndarray]]


@runtime_checkable
class Adapter(Protocol):
    NAME: str

    def configure(self, precision: str) -> None: ...

    def unavailable(self, device: str) -> str | None: ...

    def describe(self, device: str, mode: str = "eager") -> dict[str, Any]: ...

    def put(self, problem: Any, device: str, dtype: str) -> Any: ...

    def build(self, problem: Any, data: Any, device: str, dtype: str, mode: str = "eager") -> Any: ...

    def warm_up(self, trainer: Any, plan: Sequence[tuple[int, int]] = ()) -> None: ...

    def train(self, trainer: Any, start: int, stop: int) -> None: ...

    def synchronize(self, trainer: Any) -> None: ...

    def losses(self, trainer: Any, upto: int) -> np.ndarray: ...

    def params(self, trainer: Any) -> Params: ...

    def predict(self, trainer: Any, x: np.ndarray) -> np.ndarray: ...
