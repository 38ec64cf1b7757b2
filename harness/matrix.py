"""The matrix: one spec through the pipeline. The plan (harness/run/plan.py) names the
runs; each runs in its own process (harness/run/execute.py); the calibration sets the
tolerances and the checks judge every pair (harness/verdict/); one record per run is made
and written (harness/records/)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from rich.console import Console

from harness.core import provenance
from harness.core.errors import HarnessError
from harness.core.registry import CALIBRATION_KEY, FLOAT32, FLOAT64, ORACLE, ORACLE_KEY, RunKey
from harness.inputs.problem import Problem
from harness.records import write
from harness.records.build import build_record
from harness.records.schema import Record
from harness.records.write import new_id
from harness.run import anchored, plan, progress
from harness.run.execute import GPU_MIN_REPEATS, cell_path, machine, run_anchored, run_group, run_one
from harness.run.floor import Rates, floor_of
from harness.run.runner import Outcome, run
from harness.spec.load import LoadedSpec
from harness.verdict import calibration, diagnosis
from harness.verdict.checks import Calibration, Check


@dataclass
class SpecResult:
    loaded: LoadedSpec
    problem: Problem
    outcomes: dict[RunKey, Outcome]
    members: list[Outcome]  # the float32 calibration runs with their sums in another order
    checks: list[Check]
    paths: list[Path]  # the records written, if a results folder was given
    records: list[Record] = field(default_factory=list)  # one per run, written or not
    calibration: Calibration | None = None
    members64: list[Outcome] = field(default_factory=list)  # the oracle's reordered runs, first steps
    member_records: list[Record] = field(default_factory=list)  # the members', never written

    @property
    def title(self) -> str:
        """The spec's name, and a sweep point's size."""
        loaded = self.loaded
        if loaded.spec.sweep is not None and loaded.profile == loaded.spec.sweep.profile:
            return f"{loaded.name} n={len(self.problem.x_train)}"
        return loaded.name


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
    run_id = run_id or new_id()
    short = plan.twin_problem(problem)

    here = None if work_dir is None else machine()  # asked once, for every cell of the matrix

    def cell(p: Problem, key: RunKey, runs: int) -> Path | None:
        return None if work_dir is None else cell_path(work_dir, loaded, p, key, runs, here)

    def members(p: Problem, dtype: str, what: str) -> list[Outcome]:
        found = []
        for key, member in plan.calibration_members(p, dtype):
            label = f"{loaded.name} {key.label} ({what})"
            outcome = run_one(member, key, 1, label, console, isolate, cell(member, key, 1))
            found.append(calibration.in_plain_units(outcome, member.unit_orders))
        return found

    def reanchored(oracle: Outcome | None, states: dict, twin_keys: list[RunKey]):
        """Each twin re-anchored along the run at the oracle's states, and the float64
        members re-anchored at the same states (harness/run/anchored.py)."""
        if not states:
            return None, {}
        found = []
        for key, member in plan.calibration_members(problem, FLOAT64):
            at = anchored.anchored_key(key)
            label = f"{loaded.name} {at.label} (re-anchored math parity's calibration)"
            found.append(run_anchored(member, at, anchored.member_states(states, member), label, console, isolate, cell(member, at, 1)))
        runs = {}
        for key in twin_keys:
            at = anchored.anchored_key(key)
            runs[key.framework, key.device] = run_anchored(
                problem, at, states, f"{loaded.name} {at.label} (float64 twin, re-anchored)", console, isolate, cell(problem, at, 1)
            )
        return calibration.measure_segments(oracle, found), runs

    def library_references(states: dict, twin_keys: list[RunKey]):
        """For each twin whose library computes a formula of its own that the oracle can
        compute exactly (harness/known_differences.yaml, `formula`): the oracle computing it,
        over the first steps and re-anchored at the oracle's states."""
        found = {}
        for key in twin_keys:
            formula = diagnosis.library_formula(loaded.spec, key)
            if formula is None:
                continue
            ref = RunKey(ORACLE, "cpu", f"as-{key.framework}")
            lib = plan.library_problem(short, formula)
            first = run_one(
                lib, ref, 1, f"{loaded.name} {ref.label} (the oracle with {key.framework}'s formula)", console, isolate, cell(lib, ref, 1)
            )
            again = None
            if states:
                at, lib_all = anchored.anchored_key(ref), plan.library_problem(problem, formula)
                again = run_anchored(
                    lib_all,
                    at,
                    states,
                    f"{loaded.name} {at.label} (the oracle with {key.framework}'s formula, re-anchored)",
                    console,
                    isolate,
                    cell(lib_all, at, 1),
                )
            found[key.framework, key.device] = (first, again)
        return found

    outcomes = {}
    for group in plan.alternation_groups(keys):
        # The oracle's speed is nobody's question: it runs once. A GPU run is repeated at
        # least twice, so that run-to-run determinism on the device is measured.
        runs = 1 if group == [ORACLE_KEY] else repeats or loaded.spec.timing.repeats
        if group[0].device == "gpu":
            runs = max(runs, GPU_MIN_REPEATS)
        labels = {key: f"{loaded.name} {key.label}" for key in group}
        cells = {key: cell(problem, key, runs) for key in group}
        outcomes.update(run_group(problem, labels, runs, console, isolate, cells))
    members32 = members(problem, FLOAT32, "calibration: its sums in another order")
    cal32 = calibration.measure(outcomes.get(ORACLE_KEY), [outcomes.get(CALIBRATION_KEY), *members32], FLOAT32)
    members64, reference, cal64, twins_run, segments, anchored_runs, library = [], None, None, [], None, {}, {}
    if twins:
        first = RunKey(ORACLE, "cpu", f"first{short.total_steps}")
        reference = run_one(short, first, 1, f"{loaded.name} {first.label} (math parity's reference)", console, isolate, cell(short, first, 1))
        members64 = members(short, FLOAT64, "math parity's calibration")
        cal64 = calibration.measure(reference, members64, FLOAT64)
        for key in plan.twin_keys(keys):
            label = f"{loaded.name} {key.label} (float64 twin, first {short.total_steps} steps)"
            outcomes[key] = run_one(short, key, 1, label, console, isolate, cell(short, key, 1))
            twins_run.append(key)
        oracle = outcomes.get(ORACLE_KEY)
        states = oracle.anchor_states if oracle is not None and oracle.status == "ok" else {}
        segments, anchored_runs = reanchored(oracle, states, twins_run)
        library = library_references(states, twins_run)
    floors = {key: floor_of(problem, key, rates) for key in keys}  # each run's step against its device's floor
    cal = Calibration(cal32, cal64, reference, segments, anchored_runs, library)
    checks = diagnosis.verdicts(problem.spec, outcomes, cal)
    result = SpecResult(loaded, problem, outcomes, members32, checks, [], calibration=cal, members64=members64)
    where = provenance.collect()
    made = [build_record(loaded, problem, outcomes[key], checks, cal, run_id, where, floors.get(key)) for key in [*keys, *twins_run]]
    result.records = [record for record, _ in made]
    if results_dir is not None:
        result.paths = write_together(results_dir, made)
    # the members, for the terminal's table: they calibrate the checks and are not written
    result.member_records = [build_record(loaded, problem, m, [], cal, run_id, where)[0] for m in [*members32, *members64]]
    return result


def write_together(results_dir: Path, made: list[tuple[Record, bytes | None]]) -> list[Path]:
    """Write a spec's records, all or none: where one cannot be written (a full disk), those
    already written are taken back, with their artifacts, and the error goes on. First,
    what an interrupted writer left in their folders is swept (write.sweep_leftovers)."""
    for folder in {write.record_path(results_dir, record).parent for record, _ in made}:
        write.sweep_leftovers(folder)
    paths: list[Path] = []
    try:
        for record, artifact in made:
            paths.append(write.write_record(results_dir, record, artifact))
    except HarnessError:
        for path in paths:
            path.unlink(missing_ok=True)
            path.with_suffix(".npz").unlink(missing_ok=True)
        raise
    return paths


def oracle_curve(problem: Problem, out: Console | None = None) -> np.ndarray:
    """The float64 oracle's loss curve, for `harness export` (its progress on `out`)."""
    label, every = f"{problem.spec.name} {ORACLE_KEY.label}", problem.spec.logging.print_every
    shown = None if out is None else progress.printer(out, label, problem.total_steps, every)
    outcome = run(problem, ORACLE_KEY, progress=shown)
    if outcome.status != "ok":
        raise RuntimeError(f"the oracle run failed: {outcome.reason}")
    return outcome.losses
