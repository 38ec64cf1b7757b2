"""The matrix: one spec through every chosen adapter and device plus the float64 oracle,
then every check, then one record per run."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from rich.console import Console

from harness import calibration, diagnosis, progress, records, workcache
from harness.checks import Calibration, Check
from harness.errors import HarnessError
from harness.floor import Rates
from harness.fresh import ProcessDied, in_fresh_process
from harness.inputs import Problem, reordered, truncated
from harness.recording import build_record
from harness.registry import CALIBRATION, CALIBRATION_KEY, EAGER, ORACLE, ORACLE_KEY, STRICT, RunKey, runs_on
from harness.runner import Outcome, prepared_adapter, run, run_alternating
from harness.spec import LoadedSpec

GPU_MIN_REPEATS = 2


@dataclass
class SpecResult:
    loaded: LoadedSpec
    problem: Problem
    outcomes: dict[RunKey, Outcome]
    members: list[Outcome]  # the float32 calibration runs with their sums in another order
    checks: list[Check]
    paths: list[Path]  # the records written, if a results folder was given
    records: list[records.Record] = field(default_factory=list)  # one per run, written or not
    calibration: Calibration | None = None
    members64: list[Outcome] = field(default_factory=list)  # the oracle's reordered runs, first steps
    member_records: list[records.Record] = field(default_factory=list)  # the members', never written

    @property
    def title(self) -> str:
        """The spec's name, and a sweep point's size."""
        loaded = self.loaded
        if loaded.spec.sweep is not None and loaded.profile == loaded.spec.sweep.profile:
            return f"{loaded.name} n={len(self.problem.x_train)}"
        return loaded.name


def matrix_keys(frameworks: list[str], devices: list[str], tf32: bool = False, modes: tuple[str, ...] = (EAGER,)) -> list[RunKey]:
    """The chosen cells in each mode, each framework on the devices it runs on (and with
    `tf32`, each framework again on the GPU with TF32 allowed), plus the calibration run
    (numpy@cpu) and the oracle, which the checks need, both eager; the oracle runs last, as
    it is the slowest."""
    keys = [RunKey(f, d, mode=m) for m in modes for d in devices for f in frameworks if runs_on(f, d)]
    if tf32 and "gpu" in devices:
        keys += [RunKey(f, "gpu", precision="tf32", mode=m) for m in modes for f in frameworks if runs_on(f, "gpu")]
    if CALIBRATION_KEY not in keys:
        keys.append(CALIBRATION_KEY)
    keys.append(ORACLE_KEY)
    return keys


def _gpu_reasons(frameworks: list[str]) -> dict[str, str | None]:
    return {f: prepared_adapter(RunKey(f, "gpu"))[1] for f in frameworks if runs_on(f, "gpu")}


def require_gpu(frameworks: list[str]) -> None:
    """Stop before any run, with one line, when no framework finds a GPU. Asked in a
    throwaway process: a framework that starts on the GPU here would hold its memory."""
    try:
        reasons = in_fresh_process(_gpu_reasons, frameworks)
    except ProcessDied:
        raise HarnessError("no usable CUDA GPU: the probe's process died") from None
    if not reasons:
        raise HarnessError(f"--require-gpu: none of {', '.join(frameworks)} runs on the GPU")
    if all(reasons.values()):
        detail = "; ".join(f"{f}: {why}" for f, why in reasons.items())
        raise HarnessError(f"no usable CUDA GPU on this host ({detail})")


def _printers(out: Console, problem: Problem, labels: dict[RunKey, str]):
    every = problem.spec.logging.print_every
    return {key: progress.printer(out, label, problem.total_steps, every) for key, label in labels.items()}


def _run_child(problem: Problem, labels: dict[RunKey, str], repeats: int) -> dict[RunKey, Outcome]:
    """The body of an isolated run, in its own process."""
    return run_alternating(problem, list(labels), repeats, _printers(progress.console(), problem, labels))


def run_isolated(problem: Problem, labels: dict[RunKey, str], repeats: int) -> dict[RunKey, Outcome]:
    """The runs of `labels` (one, or the modes of one framework and device, taking turns) in
    a fresh process: frameworks' thread pools and GPU memory do not meet (torch on 2 cores
    ran 30x slower after JAX had run in the same process)."""
    try:
        return in_fresh_process(_run_child, problem, labels, repeats)
    except ProcessDied:
        why = "the run's process died (killed, or out of memory)"
        return {key: Outcome(key, "failed", f"{key.label}: {why}") for key in labels}


def _cell_path(work_dir: Path, loaded: LoadedSpec, problem: Problem, key: RunKey, repeats: int) -> Path:
    """Where a finished cell's outcome is kept: named by everything that makes it what it
    is (spec bytes, profile and overrides, data files, run key, repeats, code commit, and the
    host's fingerprint, not its name: a fresh machine of the same kind reuses the cell)."""
    facts = {
        "spec_sha256": loaded.sha256,
        "profile": loaded.profile,
        "overrides": loaded.overrides,
        "data": [f.sha256 for f in problem.data_files],
        "source": problem.data_source,
        "key": [key.framework, key.device, key.variant, key.precision, key.mode],
        "repeats": repeats,
        "commit": records.git_info().commit,
        "host": records.host_fingerprint(),
    }
    digest = hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()[:16]
    name = key.label
    for mark in "@+~:":
        name = name.replace(mark, "-")
    return work_dir / loaded.name / f"{name}-{digest}.json"


def _one(problem: Problem, key: RunKey, repeats: int, label: str, console: Console, isolate: bool, cell: Path | None = None) -> Outcome:
    return _group(problem, {key: label}, repeats, console, isolate, {key: cell})[key]


def _group(
    problem: Problem,
    labels: dict[RunKey, str],
    repeats: int,
    console: Console,
    isolate: bool,
    cells: dict[RunKey, Path | None],
) -> dict[RunKey, Outcome]:
    """Run the keys of `labels` together, their repeats taking turns (or take them from the
    work folder, if every one finished earlier), and keep each finished one there."""
    kept = workcache.taken(cells, console)
    if kept is not None:
        for key, cell in cells.items():
            console.print(f"[bold]{labels[key]}[/bold]: finished earlier, taken from {cell}", highlight=False)
        return kept
    steps = f"{problem.total_steps} steps, {repeats} repeat(s)"
    for key, label in labels.items():
        console.print(f"[bold]{label}[/bold] ({key.dtype}, {steps})")
    if len(labels) > 1:
        console.print(f"  their repeats take turns: {', '.join(k.label for k in labels)}", highlight=False)
    if isolate:
        outcomes = run_isolated(problem, labels, repeats)
    else:
        outcomes = run_alternating(problem, list(labels), repeats, _printers(console, problem, labels))
    for key, outcome in outcomes.items():
        name = f"{labels[key]}: " if len(labels) > 1 else ""
        if outcome.status != "ok":
            console.print(f"  {name}{outcome.status}: {outcome.reason}", style="yellow", soft_wrap=True)
        else:
            console.print(f"  {name}train {outcome.timings['train_s']:.3f} s, final loss {outcome.metrics['train_loss']:.7g}")
        cell = cells.get(key)
        if cell is not None and outcome.status == "ok":
            workcache.keep(cell, outcome, console)
    return outcomes


def alternation_groups(keys: list[RunKey]) -> list[list[RunKey]]:
    """The keys that differ only in mode, together, in order of first appearance: their
    repeats take turns in one process (harness bench). Every other key is a group of one."""
    groups: dict[tuple, list[RunKey]] = {}
    for key in keys:
        groups.setdefault((key.framework, key.device, key.variant, key.precision), []).append(key)
    return list(groups.values())


def calibration_members(problem: Problem, dtype: str = "float32") -> list[tuple[RunKey, Problem]]:
    """The calibration members: the array-module code on the problem with its sums in
    another order (inputs.reordered), each with its own seed. float32: the envelope's
    members (long_run.members, whole runs); float64: math parity's (math_parity.members,
    the oracle's code over the twins' first steps)."""
    if dtype == "float32":
        count, framework = problem.spec.checks.long_run.members, CALIBRATION
    else:
        count, framework = problem.spec.checks.math_parity.members, ORACLE
    return [(RunKey(framework, "cpu", f"order{i + 1}"), reordered(problem, seed=i + 1)) for i in range(count)]


def twin_keys(keys: list[RunKey]) -> list[RunKey]:
    """The float64 twin of every framework and device that runs strict float32."""
    twins = [k.twin for k in keys if k.framework != ORACLE and k.precision == STRICT and not k.variant]
    return list(dict.fromkeys(twins))


def twin_steps(problem: Problem) -> int:
    return min(problem.total_steps, problem.spec.checks.math_parity.steps)


def run_spec(
    loaded: LoadedSpec,
    problem: Problem,
    keys: list[RunKey],
    results_dir: Path | None,
    console: Console,
    repeats: int | None = None,
    run_id: str | None = None,
    isolate: bool = False,
    work_dir: Path | None = None,
    rates: dict[tuple[str, str], Rates] | None = None,
    twins: bool = True,
) -> SpecResult:
    """Run every key on the spec, then the calibration members, then the float64 twins of
    every framework and device over the first steps with the oracle's float64 members;
    check every pair, and write one record per run (keys and twins; the members are part
    of the checks' tolerance, not records). The modes of one framework and device run in
    one process, their repeats taking turns.

    With a `work_dir`, each finished cell is kept there and a later call with the same
    inputs takes it instead of running it again: a long matrix can be split over several
    calls (a time-limited GPU lease) or resumed after a crash."""
    run_id = run_id or records.new_id()

    def cell(p: Problem, key: RunKey, runs: int) -> Path | None:
        return None if work_dir is None else _cell_path(work_dir, loaded, p, key, runs)

    def members(p: Problem, dtype: str, what: str) -> list[Outcome]:
        found = []
        for key, member in calibration_members(p, dtype):
            label = f"{loaded.name} {key.label} ({what})"
            outcome = _one(member, key, 1, label, console, isolate, cell(member, key, 1))
            found.append(calibration.in_plain_units(outcome, member.unit_orders))
        return found

    outcomes = {}
    for group in alternation_groups(keys):
        # The oracle's speed is nobody's question: it runs once. A GPU run is repeated at
        # least twice, so that run-to-run determinism on the device is measured.
        runs = 1 if group == [ORACLE_KEY] else repeats or loaded.spec.timing.repeats
        if group[0].device == "gpu":
            runs = max(runs, GPU_MIN_REPEATS)
        labels = {key: f"{loaded.name} {key.label}" for key in group}
        cells = {key: cell(problem, key, runs) for key in group}
        outcomes.update(_group(problem, labels, runs, console, isolate, cells))
    members32 = members(problem, "float32", "calibration: its sums in another order")
    cal32 = calibration.measure(outcomes.get(ORACLE_KEY), [outcomes.get(CALIBRATION_KEY), *members32], "float32")
    members64, reference, cal64, twins_run = [], None, None, []
    if twins:
        short = truncated(problem, twin_steps(problem))
        first = RunKey(ORACLE, "cpu", f"first{short.total_steps}")
        reference = _one(short, first, 1, f"{loaded.name} {first.label} (math parity's reference)", console, isolate, cell(short, first, 1))
        members64 = members(short, "float64", "math parity's calibration")
        cal64 = calibration.measure(reference, members64, "float64")
        for key in twin_keys(keys):
            label = f"{loaded.name} {key.label} (float64 twin, first {short.total_steps} steps)"
            outcomes[key] = _one(short, key, 1, label, console, isolate, cell(short, key, 1))
            twins_run.append(key)
    cal = Calibration(cal32, cal64, reference)
    checks = diagnosis.verdicts(problem.spec, outcomes, cal)
    result = SpecResult(loaded, problem, outcomes, members32, checks, [], calibration=cal, members64=members64)
    for key in [*keys, *twins_run]:
        record, artifact = build_record(loaded, problem, outcomes[key], checks, cal, run_id, rates)
        result.records.append(record)
        if results_dir is not None:
            result.paths.append(records.write_record(results_dir, record, artifact))
    # the members, for the terminal's table: they calibrate the checks and are not written
    result.member_records = [build_record(loaded, problem, m, [], cal, run_id)[0] for m in [*members32, *members64]]
    return result


def oracle_curve(problem: Problem, out: Console | None = None) -> np.ndarray:
    """The float64 oracle's loss curve, for `harness export` (its progress on `out`)."""
    label, every = f"{problem.spec.name} {ORACLE_KEY.label}", problem.spec.logging.print_every
    shown = None if out is None else progress.printer(out, label, problem.total_steps, every)
    outcome = run(problem, ORACLE_KEY, progress=shown)
    if outcome.status != "ok":
        raise RuntimeError(f"the oracle run failed: {outcome.reason}")
    return outcome.losses
