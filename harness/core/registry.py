"""The harness's names, each defined once: adapters (mapped to module paths, imported only
when a run needs them), devices, precisions and modes; a run's key (`RunKey`), a record's
cell (`Cell`), a check's verdict (`CheckVerdict`), and the rule of which checks gate a run.

An adapter is a module with a handful of functions (see adapters/__init__.py). `import
harness` never imports torch, jax or cupy; a test proves it in a subprocess.
"""

from __future__ import annotations

import importlib
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from types import ModuleType

ADAPTERS: dict[str, str] = {
    "torch": "adapters.torch_adapter",
    "jax": "adapters.jax_adapter",
    # the array-module MLP (harness/reference/network.py), named for the library it runs on
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
STRICT = "strict"  # full float32 products everywhere
TF32 = "tf32"  # TF32 allowed on the GPU: measured, not gated
# float64: the run's float64 twin (math parity: the same spec in float64, judged against the
# oracle over its first steps; a difference there is different math, not rounding). Also
# the name of the dtype, as FLOAT32 is.
FLOAT64 = "float64"
FLOAT32 = "float32"
# bf16: mixed precision, float32 parameters and bfloat16 computation where each library puts
# it: torch's autocast (its own lists of ops in bf16 and kept in float32), flax's modules in
# dtype=bfloat16 (what the module computes), the array-module code rounding to bfloat16
# where torch's autocast on the CPU computes in it (harness/reference/autocast.py). Every
# framework has a bf16 cell. Measured against the reference and its own
# framework's float32 run on the bf16 envelope, not gated yet.
BF16 = "bf16"
PRECISIONS = (STRICT, TF32, FLOAT64, BF16)
# What `precisions` may name (harness run --precisions, run_spec): float32 is the strict
# runs, always run (they and their float64 twins judge the math), bf16 a cell of its own.
PRECISION_CHOICES = (FLOAT32, BF16)
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
    precision: str = STRICT  # strict: full float32 matmuls; tf32: TF32 allowed (GPU only); float64: the twin; bf16: mixed
    mode: str = EAGER

    @classmethod
    def from_label(cls, label: str) -> RunKey:
        """The key a label names (`torch@gpu+tf32:fast~order2`): the inverse of `label`."""
        match = LABEL.fullmatch(label)
        if match is None:
            raise ValueError(f"not a run label: {label!r}")
        framework, device, precision, mode, variant = match.groups()
        return cls(framework, device, variant or "", precision or STRICT, mode or EAGER)

    @property
    def adapter(self) -> str:
        """The adapter that runs it: the oracle is the array-module code, NumPy's or CuPy's."""
        if self.framework == ORACLE:
            return "numpy" if self.device == "cpu" else "cupy"
        return self.framework

    @property
    def dtype(self) -> str:
        return FLOAT64 if self.framework == ORACLE or self.precision == FLOAT64 else FLOAT32

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


LABEL = re.compile(r"([\w-]+)@([a-z]+)(?:\+(\w+))?(?::(\w+))?(?:~([\w-]+))?")
ORACLE_KEY = RunKey(ORACLE, "cpu")
CALIBRATION_KEY = RunKey(CALIBRATION, "cpu")
# The same array-module code on the GPU through CuPy (`harness run --references gpu`): the
# oracle in float64 and its float32 calibration run, where the CPU's would take longer than
# the GPU runs they judge.
GPU_ORACLE_KEY = RunKey(ORACLE, "gpu")
GPU_CALIBRATION_KEY = RunKey("cupy", "gpu")
REFERENCE_DEVICES = ("cpu", "gpu")
# A user's port (model.python) has no oracle: torch's float64 run is its reference, and
# torch's float32 run with the examples of each batch permuted its envelope's members.
PORT_REFERENCE_KEY = RunKey("torch", "cpu", precision=FLOAT64)
PORT_MEMBER_KEY = RunKey("torch", "cpu")
PORT_FRAMEWORKS = ("torch", "jax")
# The bf16 envelope's code: torch's autocast run on the CPU, whose members (its sums in
# other orders) measure how far bf16 rounding at autocast's boundaries carries a run from the
# reference (harness/calibrate/roles.py bf16_jobs); every bf16 run is judged on it.
BF16_MEMBER_KEY = RunKey("torch", "cpu", precision=BF16)
# Each scheme's float32 run whose members make the envelope, with the reference it measures
# them from: that pair defines the envelope and is not judged by it (nor is the bf16 one).
CALIBRATION_PAIRS = (
    {CALIBRATION_KEY, ORACLE_KEY},
    {GPU_CALIBRATION_KEY, GPU_ORACLE_KEY},
    {PORT_MEMBER_KEY, PORT_REFERENCE_KEY},
    {BF16_MEMBER_KEY, ORACLE_KEY},
    {BF16_MEMBER_KEY, PORT_REFERENCE_KEY},
)


# The checks that judge where a run diverged against where rounding alone diverges: a float32
# run's and a float64 twin's (harness.verdict.rules.divergence_check); a pass excuses the run.
DIVERGENCE_CHECKS = ("divergence", "math_divergence")
# The start of math parity's re-anchored checks' names (harness/verdict/parity.py): they read
# the re-anchored members' spread, every other twin's check that over the first steps.
ANCHORED_CHECKS = "math_anchored_"


LEAST_SEEDS = 5  # a verdict over seeds' fewest (MLPerf's; harness/verdict/seeds.py)
# A check over seeds' prefix (seeds_train_loss, ...): measured, not gated, until its rate of
# false alarms and its power are measured on more workloads than peaks (docs/verdict.md)
OVER_SEEDS = "seeds_"
HORIZON = "horizon"  # the measure of where each seed's runs part (harness/verdict/seeds.py Horizons): seeds_horizon
SEEDS_ALPHA = 0.05  # a verdict over seeds' level, shared among its checks (harness/verdict/seeds.py)
MEASURED = (TF32, BF16)  # the precisions measured against the oracle, not gated


def gates(a: RunKey, b: RunKey) -> bool:
    """Whether a failing check between runs a and b fails the run: every check but those of a
    TF32 or bf16 run, which measure a precision mode the float32 tolerances are not meant for."""
    return not {a.precision, b.precision} & set(MEASURED)


class CheckVerdict(StrEnum):
    """One check's verdict, as its record holds it."""

    PASS = "pass"
    FAIL = "fail"
    KNOWN = "known"  # a failure a known library difference explains
    SKIPPED = "skipped"  # not judged, with the reason




def verdict_counts(verdicts: Iterable[str]) -> dict[CheckVerdict, int]:
    """How many of each verdict, every verdict named (zero where none)."""
    counted = Counter(CheckVerdict(v) for v in verdicts)
    return {v: counted[v] for v in CheckVerdict}


@dataclass(frozen=True, order=True)
class Cell:
    """Which cell of a matrix a record answers: everything that makes its run what it is but
    the code (spec, profile and its overrides, data source and size, framework, device,
    precision, dtype, mode), and the host where records of several hosts stand side by side.
    A field left empty groups across it (eager and fast side by side: mode "")."""

    spec: str
    profile: str
    overrides: str = "{}"  # JSON, sorted keys: a sweep point's size
    source: str = ""
    n_train: int = 0
    framework: str = ""
    device: str = ""
    precision: str = ""
    dtype: str = ""
    mode: str = ""
    host: str = ""


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


JOINED = " + "  # in a known check's diagnosis: the library entries that explain it together


def explains(named: str) -> str:
    """The verb of a known check's share, for the entries `named` (joined by JOINED where several)."""
    return "they explain" if JOINED in named else "it explains"
