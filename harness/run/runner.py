"""Run one spec through one adapter on one device, timing each phase apart.

The device is synchronised before every clock read. A run that raises, diverges (NaN or
inf) or cannot start is an outcome with a status and a reason, never a crash of the matrix.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from adapters.protocol import KeepsTrainingState, MeasuresDefects, RecordsComputedIn, RecordsLayerOutputs
from harness.core import load, registry
from harness.core.errors import Unsupported, described
from harness.core.registry import BF16, FLOAT64, ORACLE, RunKey
from harness.inputs.problem import Params, Problem
from harness.reference import network

Progress = Callable[[int, float | None], None]


@dataclass
class Outcome:
    """What one run produced: its status, curves, snapshots, outputs, metrics and timings."""

    key: RunKey
    status: str  # ok, failed, skipped
    reason: str | None = None
    describe: dict[str, Any] = field(default_factory=dict)
    losses: np.ndarray | None = None
    snapshots: dict[int, Params] = field(default_factory=dict)
    initial_outputs: np.ndarray | None = None
    final_outputs: np.ndarray | None = None
    final_params: Params | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    timings: dict[str, Any] = field(default_factory=dict)
    repeats_bitwise_identical: bool | None = None
    repeats_max_abs_diff: float | None = None
    repeats_first_diff_step: int | None = None
    failed_at_step: int | None = None
    # float64 runs: each layer's output on the first batch, training mode (where a twin's
    # forward pass first differs from the oracle's: the diagnosis)
    layer_outputs: dict[str, np.ndarray] = field(default_factory=dict)
    # the oracle: its whole training state (harness.reference.network.training_state) at
    # each anchor of the re-anchored twins (harness/run/anchored.py), by step
    anchor_states: dict[int, Params] = field(default_factory=dict)
    # a re-anchored run: each segment's losses, by the step it starts at
    segments: dict[int, np.ndarray] = field(default_factory=dict)
    # ... and at each segment's end, by the step it starts at: every tensor (running
    # statistics too) and the probe's outputs in evaluation mode. The oracle's whole run
    # keeps the same at each anchor + math_parity.steps: what the re-anchored twins' ends
    # are judged against.
    segment_ends: dict[int, Params] = field(default_factory=dict)
    segment_outputs: dict[int, np.ndarray] = field(default_factory=dict)
    # the reference's whole run: its parameters and the probe's outputs at the twins' last
    # step (Problem.twin_steps), math parity's reference over the first steps (first_steps)
    first_params: Params | None = None
    first_outputs: np.ndarray | None = None
    # ... and its metrics there, where a twin of its own code reads them (Job.first_metrics)
    first_metrics: dict[str, float] = field(default_factory=dict)
    # where it ran (harness/execute/jobs.py where): hostname, Ray node, thread cap, fingerprint
    worker: dict[str, Any] = field(default_factory=dict)

    @property
    def diverged(self) -> bool:
        """Whether the run stopped on a non-finite loss or parameters (_diverged): its steps
        before `failed_at_step` are finite."""
        return self.status == "failed" and self.failed_at_step is not None


def first_steps(whole: Outcome, key: RunKey, steps: int, metrics: bool = False) -> Outcome | None:
    """Math parity's reference over the first `steps` (`key`), read from the reference's
    whole run, which kept its state there: what a run of those steps alone gives, bit for
    bit (the same code from the same state; the chunks a run trains in change no bit, as its
    repeats' bitwise checks show, tests/test_first_look.py). None where the whole run kept
    nothing there or its first steps are not finite, or (`metrics`: a twin of its own code,
    whose record holds them) no metrics there: that run then goes on its own."""
    if whole.first_params is None or whole.losses is None or len(whole.losses) < steps or not np.isfinite(whole.losses[:steps]).all():
        return None
    if metrics and not whole.first_metrics:
        return None
    return Outcome(
        key,
        "ok",
        describe=dict(whole.describe),
        losses=whole.losses[:steps].copy(),
        snapshots={s: p for s, p in whole.snapshots.items() if s <= steps},
        initial_outputs=whole.initial_outputs,
        final_outputs=whole.first_outputs,
        final_params=whole.first_params,
        layer_outputs=whole.layer_outputs,
        metrics=dict(whole.first_metrics) if metrics else {},
    )


def first_batch_layers(adapter, trainer, problem: Problem) -> dict[str, np.ndarray]:
    """Each layer's output on step 0's batch, with its dropout masks (a training-mode pass
    that changes no state), from the host copies of the inputs."""
    host = problem.host_arrays(FLOAT64)
    x, _ = problem.batch(host, 0)
    return adapter.layer_outputs(trainer, x, problem.step_masks(host, 0))


def final_metrics(problem: Problem, params: Params, train_out: np.ndarray, val_out: np.ndarray | None) -> dict[str, float]:
    """Loss (with its L2 term) and, for classifiers, accuracy, computed in float64 from a
    run's own outputs on the whole training and validation sets."""
    spec = problem.spec
    params64 = {name: a.astype(np.float64) for name, a in params.items()}
    n = len(problem.x_train)
    splits = [("train", train_out, problem.y_train)]
    if val_out is not None:
        splits.append(("val", val_out, problem.y_val))
    metrics = {}
    for split, out, y in splits:
        target = y.astype(np.float64) if spec.loss.kind == "mse" else y
        metrics[f"{split}_loss"] = float(network.objective(np, spec.model.placed, params64, out, target, spec.loss, n))
        if spec.loss.kind == "cross_entropy":
            metrics[f"{split}_accuracy"] = float((out.argmax(axis=-1) == y).mean())  # a text's: over every position
    return metrics


def _median_and_spread(values: list[float]) -> tuple[float, float]:
    return statistics.median(values), max(values) - min(values)


def prepared_adapter(key: RunKey):
    """The adapter of `key`, and why it cannot run there (or None)."""
    if not registry.runs_on(key.adapter, key.device):
        return None, f"{key.adapter} runs on the {' and '.join(registry.ONLY_ON[key.adapter])} only"
    try:
        adapter = registry.load(key.adapter)
    except ImportError as exc:
        return None, f"adapter {key.adapter} cannot be imported: {exc}"
    return adapter, adapter.unavailable(key)


def run(problem: Problem, key: RunKey, repeats: int = 1, progress: Progress | None = None) -> Outcome:
    """Train `problem` with the adapter of `key`, `repeats` times from the same initial state."""
    return run_alternating(problem, [key], repeats, {key: progress} if progress else None)[key]


def run_alternating(
    problem: Problem,
    keys: list[RunKey],
    repeats: int = 1,
    progress: dict[RunKey, Progress] | None = None,
    metrics: bool = True,
    first_metrics: bool = False,
) -> dict[RunKey, Outcome]:
    """Train `problem` with each key `repeats` times, the keys taking turns repeat by repeat
    (eager, fast, eager, fast, ...): a drift in the machine's speed during the run falls on
    every key alike, so their time ratio holds where back-to-back repeats would not.
    `metrics`: the final loss and accuracy on the whole training and validation sets (a
    prediction over each); without, the outcome has the probe's final outputs only.
    `first_metrics`: the reference's the same at the twins' last step too (Job.first_metrics)."""
    outcomes: dict[RunKey, Outcome] = {}
    trials: dict[RunKey, _Trial] = {}

    def attempt(key: RunKey, step: Callable[[], None]) -> None:
        try:
            step()
        except Unsupported as exc:  # a documented limit of the adapter's mode: skipped, with why
            outcomes[key] = Outcome(key, "skipped", str(exc))
            trials.pop(key, None)
        except Exception as exc:  # a framework error (out of memory, driver) fails this run only
            detail = described(exc)
            outcomes[key] = Outcome(key, "failed", f"{key.label} raised {detail}")
            trials.pop(key, None)

    for key in keys:
        adapter, reason = prepared_adapter(key)
        if reason:
            outcomes[key] = Outcome(key, "skipped", reason)
            continue

        def start(key=key, adapter=adapter) -> None:
            trials[key] = _Trial(adapter, problem, key, (progress or {}).get(key), metrics, first_metrics)

        attempt(key, start)
    for repeat in range(repeats):
        for key, trial in list(trials.items()):
            attempt(key, lambda trial=trial, repeat=repeat: trial.repeat(repeat))
    for key, trial in trials.items():
        outcomes[key] = trial.finish()
        if len(keys) > 1:
            outcomes[key].timings["alternated_with"] = [k.label for k in keys if k != key]
    return {key: outcomes[key] for key in keys}


PROGRESS_CUTS = 20


def chunk_plan(problem: Problem, extra: tuple[int, ...] = ()) -> list[tuple[int, int]]:
    """The [start, stop) ranges the training loop runs in. It stops only where the runner
    must look (the parameter snapshots, the progress lines, and `extra`: the oracle's
    segment ends), so a fast mode runs hundreds of steps per call; the plan is the same in
    every mode and every repeat."""
    total = problem.total_steps
    every = problem.spec.logging.print_every
    # and every twentieth of the run, so that progress shows however print_every is set
    twentieth = max(1, total // PROGRESS_CUTS)
    cuts = {
        0,
        total,
        1,
        problem.spec.checks.params_after_steps.step,
        *range(every, total, every),
        *range(twentieth, total, twentieth),
        *problem.anchors,
        *extra,
    }
    cuts = sorted(c for c in cuts if 0 <= c <= total)
    return list(zip(cuts, cuts[1:]))


class _Trial:
    """One key's repeats, run one at a time (run_alternating interleaves them with other
    keys'). Each repeat puts the data, builds, warms up and trains from the same initial
    state, each phase timed apart; the first keeps the curve, snapshots and outputs, the
    others are compared with it bit for bit."""

    def __init__(self, adapter, problem: Problem, key: RunKey, progress: Progress | None, metrics: bool = True, first_metrics: bool = False):
        self.adapter, self.problem, self.key, self.progress, self.metrics = adapter, problem, key, progress, metrics
        self.outcome = Outcome(key, "ok", describe=adapter.describe(key))
        # the reference (the oracle, on either device; a port's torch float64 run) keeps its
        # state at each anchor and at each segment's end (harness/run/anchored.py)
        reference = key == problem.reference_key or (key.framework == ORACLE and not key.variant)
        self.anchors = set(problem.anchors) if reference and isinstance(adapter, KeepsTrainingState) else set()
        self.ends = {a + problem.spec.checks.math_parity.steps: a for a in self.anchors}
        # ... and at the twins' last step, math parity's reference over the first steps (first_steps)
        self.first = problem.twin_steps if reference else None
        self.first_metrics = first_metrics and reference
        self.plan = chunk_plan(problem, (*self.ends, *([self.first] if self.first else [])))
        self.transfer: list[float] = []
        self.warmup: list[float] = []
        self.train: list[float] = []
        self.others: list[float | None] = []  # each repeat's share of the host's CPU that others took (harness/core/load.py)

    def repeat(self, repeat: int) -> None:
        adapter, problem, key, outcome = self.adapter, self.problem, self.key, self.outcome
        total = problem.total_steps
        snapshot_steps = {1, problem.spec.checks.params_after_steps.step}
        anchors, ends = self.anchors, self.ends
        start = time.perf_counter()
        data = adapter.put(problem, key)
        trainer = adapter.build(problem, data, key)
        adapter.synchronize(trainer)
        self.transfer.append(time.perf_counter() - start)

        start = time.perf_counter()
        adapter.warm_up(trainer, self.plan)
        adapter.synchronize(trainer)
        self.warmup.append(time.perf_counter() - start)

        if repeat == 0:
            if key.dtype != FLOAT64 and isinstance(adapter, MeasuresDefects) and (found := adapter.defects(trainer)):
                outcome.describe["defects"] = found
            outcome.initial_outputs = adapter.predict(trainer, problem.probe)
            if key.dtype == FLOAT64 and problem.jitter_seed is None and isinstance(adapter, RecordsLayerOutputs):
                outcome.layer_outputs = first_batch_layers(adapter, trainer, problem)
            if key.precision == BF16 and isinstance(adapter, RecordsComputedIn):  # where it computes in bf16, recorded
                outcome.describe.setdefault("math_mode", {})["computed_in"] = adapter.computed_in(trainer)
        start, host = time.perf_counter(), load.sample()
        aside = 0.0  # the whole-set predictions at the twins' last step: not training (as the final metrics are not)
        for first, stop in self.plan:
            adapter.train(trainer, first, stop)
            if repeat == 0 and (self.progress or stop in snapshot_steps):
                now = adapter.state(trainer, stop)  # read back once for both
                if stop in snapshot_steps:
                    outcome.snapshots[stop] = now.params
                if self.progress:  # the printer decides what to show (progress.printer)
                    self.progress(stop, float(now.losses[-1]))
            if repeat == 0 and stop in anchors:
                outcome.anchor_states[stop] = adapter.training_state(trainer)
            if repeat == 0 and stop in ends:
                outcome.segment_ends[ends[stop]] = adapter.training_state(trainer)
                outcome.segment_outputs[ends[stop]] = adapter.predict(trainer, problem.probe)
            if repeat == 0 and stop == self.first:
                outcome.first_params = adapter.state(trainer, stop).params
                outcome.first_outputs = adapter.predict(trainer, problem.probe)
                if self.first_metrics:
                    began = time.perf_counter()
                    outcome.first_metrics = _metrics(adapter, trainer, problem, outcome.first_params)
                    aside += time.perf_counter() - began
        adapter.synchronize(trainer)
        self.train.append(time.perf_counter() - start - aside)
        self.others.append(load.others_share(host, load.sample()))

        curve, params = adapter.state(trainer, total)
        if repeat == 0:
            outcome.losses, outcome.final_params = curve, params
            _finish(adapter, trainer, problem, outcome, self.metrics)
        else:
            _compare_repeat(outcome, curve, params)

    def finish(self) -> Outcome:
        self.outcome.timings = _timings(self.problem, self.transfer, self.warmup, self.train, self.others)
        return self.outcome


def _compare_repeat(outcome: Outcome, curve: np.ndarray, params: Params) -> None:
    """Fold one more repeat into the run-to-run verdict: bitwise equality of the loss curve
    and the final parameters with the first repeat, and if not, how far apart."""
    first = np.concatenate([outcome.losses, *(np.ravel(a) for a in outcome.final_params.values())])
    this = np.concatenate([curve, *(np.ravel(a) for a in params.values())])
    same = first.shape == this.shape and np.array_equal(first, this, equal_nan=True)
    outcome.repeats_bitwise_identical = same and outcome.repeats_bitwise_identical is not False
    if same:
        return
    diff = float(np.nanmax(np.abs(first - this))) if first.shape == this.shape else float("inf")
    outcome.repeats_max_abs_diff = max(diff, outcome.repeats_max_abs_diff or 0.0)
    differs = np.flatnonzero(curve != outcome.losses) if curve.shape == outcome.losses.shape else np.array([0])
    step = int(differs[0]) if differs.size else len(curve)  # the curve agrees: only parameters differ
    if outcome.repeats_first_diff_step is None or step < outcome.repeats_first_diff_step:
        outcome.repeats_first_diff_step = step


def _finish(adapter, trainer, problem: Problem, outcome: Outcome, metrics: bool = True) -> None:
    """Final outputs and (with `metrics`) metrics of a trained run, or its divergence: a
    non-finite loss or parameter at its step, or finite parameters whose own forward pass
    overflows (non-finite outputs or whole-set metrics) after its last step."""
    bad = _first_non_finite(outcome.losses, outcome.final_params)
    if bad is not None:
        _diverged(problem, outcome, bad, f"non-finite loss or parameters at step {bad}")
        return
    outcome.final_outputs = adapter.predict(trainer, problem.probe)
    if metrics:
        outcome.metrics = _metrics(adapter, trainer, problem, outcome.final_params)
    if not (np.isfinite(outcome.final_outputs).all() and all(np.isfinite(v) for v in outcome.metrics.values())):
        step = len(outcome.losses)
        outcome.final_outputs, outcome.metrics = None, {}
        _diverged(problem, outcome, step, f"non-finite outputs of finite parameters after its last step ({step})")


def _diverged(problem: Problem, outcome: Outcome, step: int, what: str) -> None:
    outcome.status, outcome.failed_at_step = "failed", step
    outcome.reason = f"diverged: {what}"
    if problem.port is not None:  # a port's own code: its file named
        outcome.reason = f"{problem.port}: {outcome.key.label} {outcome.reason}"


def _metrics(adapter, trainer, problem: Problem, params: Params) -> dict[str, float]:
    """final_metrics of the trainer's present state, whose tensors are `params`."""
    train_out = adapter.predict(trainer, problem.x_train)
    val_out = adapter.predict(trainer, problem.x_val) if problem.x_val is not None else None
    return final_metrics(problem, params, train_out, val_out)


def _first_non_finite(losses: np.ndarray, params: Params) -> int | None:
    bad = np.flatnonzero(~np.isfinite(losses))
    if bad.size:
        return int(bad[0])
    if not all(np.isfinite(a).all() for a in params.values()):
        return len(losses)
    return None


def _timings(problem: Problem, transfer: list[float], warmup: list[float], train: list[float], others: list[float | None] = ()) -> dict[str, Any]:
    train_median, train_spread = _median_and_spread(train)
    known = [share for share in others if share is not None]
    return {
        "repeats": len(train),
        "total_steps": problem.total_steps,
        "data_prep_s": problem.prep_seconds,
        "transfer_s": statistics.median(transfer),
        "warmup_s": statistics.median(warmup),
        "warmup_s_each": warmup,
        "train_s": train_median,
        "train_s_spread": train_spread,
        "train_s_each": train,
        "per_step_s": train_median / max(problem.total_steps, 1),
        "others_cpu_share": statistics.median(known) if known else None,
    }
