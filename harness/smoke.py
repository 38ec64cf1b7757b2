"""`harness smoke`: a machine's first call (a lent GPU, a new CUDA host, a fresh install),
in a minute or two, before any hour of the matrix is spent on it.

Every adapter trains every spec's network, and so every layer kind, activation and recipe
the specs use, for a few steps on synthetic inputs of the spec's shapes (no data files):
on each device, in each precision (strict, its float64 twin, TF32 on the GPU) and, strict,
in its fast mode too; each (framework, device, precision) in a fresh process, as the matrix
runs them. A row fails where its run:
- raises, or cannot start where it was asked to run;
- logs a missing or non-finite loss;
- repeats with other bits (two runs in one process, as the matrix's repeats);
- reads back a math-mode flag other than its precision asks for (`expected_flags`: written
  from the libraries' documentation, not from the adapters' code, so that it checks them);
- computes a first loss or initial outputs further from the float64 oracle's than `BARS`,
  or logs losses further from the oracle's than CURVE_FACTOR times that.

Not a verdict: the matrix's checks are calibrated per spec. These bars are about 100 times
the rounding of a forward pass in each precision, and catch a path broken outright (a
layout, a padding, a kernel that fails or falls back on the device).
"""

from __future__ import annotations

import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from harness.core.registry import ADAPTERS, EAGER, FAST, FLOAT64, ORACLE_KEY, STRICT, TF32, RunKey
from harness.execute import plan
from harness.execute.fresh import ProcessDied, in_fresh_process
from harness.inputs.problem import Problem, in_memory, truncated
from harness.layers import KINDS
from harness.spec.load import load_spec
from harness.spec.model import Spec

STEPS = 3  # two of the spec's batch size, then one smaller (a second size: CUDA graphs and jits per size)
FULL_BATCH_ROWS = 64  # a full-batch spec's synthetic set
# Relative distance from the oracle's first loss and initial outputs (max |a - b| / max |b|)
# above which a row fails. A forward pass in float64 differs from the oracle's by summation
# order (about 1e-15); in float32 by about sqrt(n) * 6e-8 for a sum of n terms (1e-6 for the
# specs' widest layers); with TF32's 10-bit mantissa, by about 1e-3.
BARS = {FLOAT64: 1e-10, STRICT: 1e-4, TF32: 1e-2}
# The logged losses of all the steps: ten times that (float32 runs here stayed within 8e-7
# of the oracle's over 3 steps). It catches a loss written to another slot of the log, or
# to none (a slot never written reads 0).
CURVE_FACTOR = 10
XLA_DETERMINISTIC = "--xla_gpu_deterministic_ops=true"


def expected_flags(key: RunKey) -> dict[str, tuple]:
    """What each math-mode flag of `key`'s run must read (any of the values given).

    torch: torch.use_deterministic_algorithms(True) (cuDNN convolutions deterministic);
    cuBLAS's deterministic workspace (CUBLAS_WORKSPACE_CONFIG :4096:8 or :16:8, as torch's
    reproducibility notes say); TF32 off in matmuls and cuDNN unless the run is TF32; cuDNN
    benchmarking off (it may pick another algorithm each run). JAX: XLA's deterministic ops
    (which also makes its autotuner pick the first config: no timing-dependent choice), the
    default matmul and convolution precision, and x64 only in the float64 twin. CuPy: its
    cuBLAS handle's TF32 (CUPY_TF32, read once per process)."""
    tf32 = key.precision == TF32
    if key.adapter == "torch":
        want: dict[str, tuple] = {
            "deterministic_algorithms": (True,),
            "cuda.matmul.allow_tf32": (tf32,),
            "cudnn.allow_tf32": (tf32,),
            "float32_matmul_precision": ("high",) if tf32 else ("highest",),
        }
        if key.device == "gpu":
            want["cudnn.benchmark"] = (False,)
            want["CUBLAS_WORKSPACE_CONFIG"] = (":4096:8", ":16:8")
        return want
    if key.adapter == "jax":
        return {
            "jax_default_matmul_precision": ("tensorfloat32",) if tf32 else ("highest",),
            "jax_enable_x64": (key.precision == FLOAT64,),
            "xla_gpu_deterministic_ops": (True,),
        }
    if key.framework == "cupy":
        return {"CUPY_TF32": ("1",) if tf32 else ("0",)}
    return {}


def read_flags(key: RunKey, math_mode: dict[str, Any]) -> dict[str, Any]:
    """The flags of `expected_flags` as the run's describe() read them back (None: not read)."""
    found = dict(math_mode)
    if key.adapter == "jax":
        found["xla_gpu_deterministic_ops"] = XLA_DETERMINISTIC in str(math_mode.get("XLA_FLAGS", "")).split()
    return {name: found.get(name) for name in expected_flags(key)}


def smoke_problem(spec: Spec, steps: int = STEPS, seed: int = 0) -> Problem:
    """`spec`'s network, initial state, loss and recipe on seeded normal inputs of its shape
    (a text's: token ids of its context and vocabulary):
    two batches of its size and a smaller third (or FULL_BATCH_ROWS rows, full-batch),
    trained for `steps` steps."""
    training, size = spec.training, spec.training.batch_size
    if size == "full":
        rows = FULL_BATCH_ROWS
    else:  # a smaller last batch where the spec keeps one; dropped, a third whole one
        rows = 2 * size + max(1, size // 2) if training.last_batch == "keep" else 3 * size
    spec = spec.model_copy(update={"training": training.model_copy(update={"epochs": max(training.epochs, steps)})})
    rng = np.random.default_rng(seed)
    tokens = spec.model.tokens
    if tokens is not None:  # a text's examples: token ids, each position's target an id too
        x = rng.integers(0, tokens.vocabulary, size=(rows, tokens.context))
        return truncated(in_memory(spec, x, rng.integers(0, tokens.vocabulary, size=(rows, tokens.context))), steps)
    x = rng.normal(size=(rows, spec.model.in_features)).astype(np.float32)
    outputs = spec.model.n_outputs
    y = rng.normal(size=(rows, outputs)).astype(np.float32) if spec.loss.kind == "mse" else rng.integers(0, outputs, size=rows)
    return truncated(in_memory(spec, x, y), steps)


@dataclass
class Row:
    spec: str
    label: str
    status: str  # ok, failed, skipped
    reason: str | None = None
    flags: dict[str, Any] = field(default_factory=dict)
    repeats_bitwise: bool | None = None
    losses: list[float] = field(default_factory=list)
    first_loss_distance: float | None = None
    curve_distance: float | None = None
    outputs_distance: float | None = None
    seconds: float = 0.0
    version: str = ""
    device_name: str = ""
    problems: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.status == "skipped" or not self.problems


def _group(spec_paths: list[Path], keys: list[RunKey], steps: int, repeats: int) -> dict[tuple[str, str], Any]:
    """In a fresh process: each key's runs of every spec's smoke problem. Per (spec, label):
    the outcome's parts a row needs (plain values and arrays)."""
    from harness.run import runner

    found = {}
    for path in spec_paths:
        loaded = load_spec(path, "quick")
        problem = smoke_problem(loaded.spec, steps)
        for key in keys:
            began = time.perf_counter()
            outcome = runner.run(problem, key, repeats=repeats)
            found[loaded.name, key.label] = {
                "status": outcome.status,
                "reason": outcome.reason,
                "describe": outcome.describe,
                "losses": None if outcome.losses is None else np.asarray(outcome.losses, np.float64),
                "outputs": outcome.initial_outputs,
                "repeats_bitwise": outcome.repeats_bitwise_identical,
                "seconds": time.perf_counter() - began,
            }
    return found


def _distance(value: np.ndarray, reference: np.ndarray) -> float:
    value, reference = np.asarray(value, np.float64), np.asarray(reference, np.float64)
    if value.shape != reference.shape:
        return float("inf")
    return float(np.abs(value - reference).max() / max(np.abs(reference).max(), np.finfo(np.float64).tiny))


def judged(spec: str, key: RunKey, got: dict[str, Any], reference: dict[str, Any] | None, steps: int) -> Row:
    """A row from one run's parts and the oracle's: its problems, if any."""
    describe = got.get("describe") or {}
    row = Row(spec, key.label, got["status"], got.get("reason"), seconds=round(got.get("seconds", 0.0), 3))
    row.version, row.device_name = str(describe.get("version", "")), str(describe.get("device_name", ""))
    if row.status == "skipped":
        return row
    if row.status != "ok":
        row.problems.append(f"{row.status}: {row.reason}")
        return row
    row.flags = read_flags(key, describe.get("math_mode", {}))
    for name, allowed in expected_flags(key).items():
        if row.flags[name] not in allowed:
            row.problems.append(f"{name} reads {row.flags[name]!r}, not {' or '.join(map(repr, allowed))}")
    losses = got["losses"]
    row.losses = [float(v) for v in losses]
    if len(losses) != steps or not np.isfinite(losses).all():
        row.problems.append(f"losses logged: {row.losses} ({steps} finite ones expected)")
    row.repeats_bitwise = got["repeats_bitwise"]
    if row.repeats_bitwise is False:
        row.problems.append("its two runs gave other bits")
    if reference is not None and reference["status"] == "ok":
        bar = BARS[key.precision]
        row.first_loss_distance = _distance(losses[:1], reference["losses"][:1])
        row.outputs_distance = _distance(got["outputs"], reference["outputs"])
        row.curve_distance = _distance(losses, reference["losses"]) if len(losses) == len(reference["losses"]) else None
        for what, distance, limit in (
            ("first loss", row.first_loss_distance, bar),
            ("initial outputs", row.outputs_distance, bar),
            ("logged losses", row.curve_distance, CURVE_FACTOR * bar),
        ):
            if distance is not None and not distance <= limit:
                row.problems.append(f"{what} {distance:.2e} from the oracle's (bar {limit:.0e} for {key.precision})")
    return row


def keys_for(frameworks: list[str], devices: list[str]) -> list[list[RunKey]]:
    """The groups of keys, one fresh process each, as the matrix plans them (harness/execute/plan.py):
    each chosen framework and device strict, its modes together; its float64 twin; and on
    the GPU, TF32 (eager)."""
    runs = [k for k in plan.matrix_keys(frameworks, devices, tf32=True, modes=(EAGER, FAST)) if k.framework in frameworks]
    strict = [k for k in runs if k.precision == STRICT]
    tf32 = [[k] for k in runs if k.precision == TF32 and k.mode == EAGER]
    return plan.alternation_groups(strict) + [[twin] for twin in plan.twin_keys(strict)] + tf32


def coverage(specs: list[Spec]) -> dict[str, list[str]]:
    """What the specs exercise, and the layer kinds none of them does."""
    # every placed layer, a residual's body too (a port has none of the spec's layers)
    layers = sorted({p.module.KIND for spec in specs for p in spec.model.placed})
    activations = sorted({str(p.activation) for spec in specs for p in spec.model.placed if getattr(p, "activation", None)})
    optimizers = sorted({spec.optimizer.kind for spec in specs})
    recipes = set()
    for spec in specs:
        opt = spec.optimizer
        recipes.update(name for name in ("momentum", "nesterov", "dampening", "weight_decay", "clip_global_norm") if getattr(opt, name, None))
        if getattr(opt, "schedule", None) is not None:
            recipes.add(f"schedule {opt.schedule.kind}")
        if spec.loss.label_smoothing:
            recipes.add("label_smoothing")
    return {
        "layers": layers,
        "activations": activations,
        "optimizers": optimizers,
        "recipes": sorted(recipes),
        "layers not exercised": sorted(set(KINDS) - set(layers)),
    }


def smoke(
    spec_paths: list[Path], frameworks: list[str] | None, devices: list[str], steps: int = STEPS, repeats: int = 2, on_row=None
) -> dict[str, Any]:
    """The smoke: its rows (one per spec and run), how many are ok, skipped and failed (the
    oracle's too), what the specs cover, and the host. Interrupted (Ctrl-C, a lease's
    budget), it returns the rows it has, `interrupted` and not passed."""
    frameworks = list(frameworks or ADAPTERS)
    specs = [load_spec(path, "quick") for path in spec_paths]
    began = time.perf_counter()
    reference: dict = {}
    rows: list[Row] = []
    interrupted = False
    try:
        try:
            reference = in_fresh_process(_group, spec_paths, [ORACLE_KEY], steps, 1)
        except ProcessDied:
            pass
        for keys in keys_for(frameworks, devices):
            try:
                found = in_fresh_process(_group, spec_paths, keys, steps, repeats)
            except ProcessDied:
                found = {
                    (s.name, k.label): {"status": "failed", "reason": "the smoke's process died (killed, or out of memory)"}
                    for s in specs
                    for k in keys
                }
            for loaded in specs:
                for key in keys:
                    row = judged(loaded.name, key, found[loaded.name, key.label], reference.get((loaded.name, ORACLE_KEY.label)), steps)
                    rows.append(row)
                    if on_row is not None:
                        on_row(row)
    except KeyboardInterrupt:
        interrupted = True
    oracle = [
        judged(
            s.name, ORACLE_KEY, reference.get((s.name, ORACLE_KEY.label), {"status": "failed", "reason": "the oracle's process died"}), None, steps
        )
        for s in specs
    ]
    return {
        "host": {"machine": platform.node(), "python": platform.python_version()},
        "steps": steps,
        "repeats": repeats,
        "bars": BARS,
        "coverage": coverage([s.spec for s in specs]),
        "oracle": [asdict(r) for r in oracle],
        "rows": [asdict(r) for r in rows],
        "counts": {
            "ok": sum(r.status == "ok" and r.passed for r in rows),
            "skipped": sum(r.status == "skipped" for r in rows),
            "failed": sum(not r.passed for r in rows + oracle),
        },
        "passed": not interrupted and all(r.passed for r in rows + oracle),
        "interrupted": interrupted,
        "seconds": round(time.perf_counter() - began, 1),
    }
