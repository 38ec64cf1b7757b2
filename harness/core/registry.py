"""Adapter names mapped to module paths, imported only when a run needs them.

An adapter is a module with a handful of functions (see adapters/__init__.py). `import
harness` never imports torch, jax or cupy; a test proves it in a subprocess.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from types import ModuleType

ADAPTERS: dict[str, str] = {
    "torch": "adapters.torch_adapter",
    "jax": "adapters.jax_adapter",
    # the array-module MLP (harness/reference/xp_mlp.py), named for the library it runs on
    "numpy": "adapters.xp_adapter",
    "cupy": "adapters.xp_adapter",
}
DEVICES = ("cpu", "gpu")
# The devices each framework runs on (all, where not listed): NumPy is the array-module
# code on the CPU, CuPy the same code on the GPU.
ONLY_ON: dict[str, tuple[str, ...]] = {"numpy": ("cpu",), "cupy": ("gpu",)}
ORACLE = "oracle"  # the reference: the array-module code on NumPy in float64
CALIBRATION = "numpy"  # its float32 CPU run against the oracle measures float32 rounding on a spec
# Records written before NumPy had its own name say `cupy` for the array-module code on the CPU.
RENAMED = {("cupy", "cpu"): "numpy"}
STRICT = "strict"
# float64: the run's float64 twin (math parity: the same spec in float64, judged against the
# oracle over its first steps; a difference there is different math, not rounding)
FLOAT64 = "float64"
PRECISIONS = (STRICT, "tf32", FLOAT64)
# eager: the article-style code, one framework call per step; fast: each framework's
# compiled mode (JAX scan, torch compile or CUDA graph, CuPy fused kernels and graph).
EAGER = "eager"
FAST = "fast"
MODES = (EAGER, FAST)


@dataclass(frozen=True)
class RunKey:
    """One cell of the matrix: a framework (or the oracle) on a device."""

    framework: str
    device: str
    variant: str = ""  # a calibration member: same code and inputs, sums in another order
    precision: str = "strict"  # strict: full float32 matmuls; tf32: TF32 allowed (GPU only); float64: the twin
    mode: str = EAGER

    @property
    def adapter(self) -> str:
        return "numpy" if self.framework == ORACLE else self.framework

    @property
    def dtype(self) -> str:
        return "float64" if self.framework == ORACLE or self.precision == FLOAT64 else "float32"

    @property
    def twin(self) -> RunKey:
        """This cell's float64 twin (eager, on the same device)."""
        return RunKey(self.framework, self.device, precision=FLOAT64)

    @property
    def label(self) -> str:
        label = f"{self.framework}@{self.device}"
        if self.precision != STRICT:
            label += f"+{self.precision}"
        if self.mode != EAGER:
            label += f":{self.mode}"
        return label + (f"~{self.variant}" if self.variant else "")


ORACLE_KEY = RunKey(ORACLE, "cpu")
CALIBRATION_KEY = RunKey(CALIBRATION, "cpu")


def runs_on(framework: str, device: str) -> bool:
    return device in ONLY_ON.get(framework, DEVICES)


def code_name(framework: str) -> str:
    """The name of the code a framework runs, which a speedup pairs across devices: NumPy on
    the CPU and CuPy on the GPU run the same array-module code, `numpy/cupy`."""
    return "numpy/cupy" if framework in ONLY_ON else framework


def current_name(framework: str, device: str) -> str:
    """A framework's name now, for one read from an older record."""
    return RENAMED.get((framework, device), framework)


def current_label(label: str) -> str:
    """A run label (`cupy@cpu~order3`) with its framework's current name (`numpy@cpu~order3`)."""
    framework, at, rest = label.partition("@")
    device = re.match(r"[a-z]*", rest).group()  # what follows: +precision, :mode, ~variant
    return current_name(framework, device) + at + rest if at else label


def load(adapter: str) -> ModuleType:
    return importlib.import_module(ADAPTERS[adapter])
