"""The matrix: one spec through the pipeline. The plan (harness/run/plan.py) names the
runs; its cells run on an executor (harness/run/schedule.py, executors.py); the calibration sets the
tolerances and the checks judge every pair (harness/verdict/); one record per run is made
and written (harness/records/)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from rich.console import Console

from harness.core import provenance
from harness.core.errors import HarnessError
from harness.core.registry import CALIBRATION_KEY, FLOAT32, FLOAT64, ORACLE, ORACLE_KEY, RunKey
from harness.inputs import members
from harness.inputs.problem import Problem
from harness.records import write
from harness.records.build import build_record
from harness.records.schema import Record
from harness.records.write import new_id
from harness.run import anchored, cells, executors, hosts, plan, progress, schedule
from harness.run.execute import GPU_MIN_REPEATS, cell_path, machine
from harness.run.floor import Rates, floor_of
from harness.run.runner import Outcome, run
from harness.spec.load import LoadedSpec
from harness.verdict import calibration, cross_host, diagnosis
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
    cross_host: list[cross_host.CrossHost] = field(default_factory=list)  # runs made at several places (harness/run/hosts.py)

    @property
    def title(self) -> str:
        """The spec's name, and a sweep point's size."""
        loaded = self.loaded
        if loaded.spec.sweep is not None and loaded.profile == loaded.spec.sweep.profile:
            return f"{loaded.name} n={len(self.problem.x_train)}"
        return loaded.name


def plan_cells(loaded: LoadedSpec, problem: Problem, keys: list[RunKey], repeats: int | None, twins: bool) -> list[cells.Cell]:
    """The spec's matrix as cells (harness/run/cells.py): the chosen runs, their modes
    together; the calibration members; with `twins`, math parity's reference, members and
    twins over the first steps, the library references, and the re-anchored members, twins
    and library references, which need the oracle's states."""
    name, short = loaded.name, plan.twin_problem(problem)
    total, first_steps = problem.total_steps, short.total_steps

    def cost(key: RunKey, steps: int, runs: int = 1) -> float:
        return steps * runs * (2.0 if key.dtype == FLOAT64 else 1.0)

    found = []
    for group in plan.alternation_groups(keys):
        # The oracle's speed is nobody's question: it runs once. A GPU run is repeated at
        # least twice, so that run-to-run determinism on the device is measured.
        runs = 1 if group == [ORACLE_KEY] else repeats or loaded.spec.timing.repeats
        if group[0].device == "gpu":
            runs = max(runs, GPU_MIN_REPEATS)
        labels = tuple((key, f"{name} {key.label}") for key in group)
        found.append(cells.Cell(group[0].label, cells.FRAMEWORK, labels, runs, cost=sum(cost(k, total, runs) for k in group)))
    found += member_cells(loaded, problem, plan.member_seeds(problem, FLOAT32))
    found += library_member_cells(loaded, problem, keys)
    if not twins:
        return found
    first = RunKey(ORACLE, "cpu", f"first{first_steps}")
    label = f"{name} {first.label} (math parity's reference)"
    found.append(cells.Cell(first.label, cells.REFERENCE, ((first, label),), steps=first_steps, cost=cost(first, first_steps), metrics=False))
    for key, seed in plan.member_seeds(problem, FLOAT64):
        label = f"{name} {key.label} (math parity's calibration)"
        found.append(
            cells.Cell(key.label, cells.MEMBER64, ((key, label),), steps=first_steps, member=seed, cost=cost(key, first_steps), metrics=False)
        )
    oracle = (ORACLE_KEY.label,) if ORACLE_KEY in keys and problem.anchors else None
    anchored_cost = cost(ORACLE_KEY, problem.spec.checks.math_parity.steps * len(problem.anchors))
    if oracle:
        for key, seed in plan.member_seeds(problem, FLOAT64):
            at = anchored.anchored_key(key)
            label = f"{name} {at.label} (re-anchored math parity's calibration)"
            found.append(cells.Cell(at.label, cells.ANCHORED_MEMBER, ((at, label),), member=seed, needs=oracle, cost=anchored_cost))
    for key in plan.twin_keys(keys):
        label = f"{name} {key.label} (float64 twin, first {first_steps} steps)"
        found.append(cells.Cell(key.label, cells.TWIN, ((key, label),), steps=first_steps, cost=cost(key, first_steps)))
        if oracle:
            at = anchored.anchored_key(key)
            label = f"{name} {at.label} (float64 twin, re-anchored)"
            found.append(cells.Cell(at.label, cells.ANCHORED_TWIN, ((at, label),), needs=oracle, cost=anchored_cost))
        formula = plan.resolved(diagnosis.library_formula(loaded.spec, key), problem)
        ref = RunKey(ORACLE, "cpu", f"as-{key.framework}")
        if formula is None or any(c.name == ref.label for c in found):  # one per framework, whatever its devices
            continue
        label = f"{name} {ref.label} (the oracle with {key.framework}'s formula)"
        found.append(
            cells.Cell(ref.label, cells.LIBRARY, ((ref, label),), steps=first_steps, formula=formula, cost=cost(ref, first_steps), metrics=False)
        )
        # that formula's own rounding spread: the oracle's members computing it
        library_members = [(RunKey(ORACLE, "cpu", f"{ref.variant}-{k.variant}"), seed) for k, seed in plan.member_seeds(problem, FLOAT64)]
        for mk, seed in library_members:
            label = f"{name} {mk.label} (math parity's calibration, {key.framework}'s formula)"
            found.append(
                cells.Cell(
                    mk.label,
                    cells.LIBRARY_MEMBER,
                    ((mk, label),),
                    steps=first_steps,
                    member=seed,
                    formula=formula,
                    cost=cost(mk, first_steps),
                    metrics=False,
                )
            )
        if oracle:
            at = anchored.anchored_key(ref)
            label = f"{name} {at.label} (the oracle with {key.framework}'s formula, re-anchored)"
            found.append(cells.Cell(at.label, cells.LIBRARY_ANCHORED, ((at, label),), formula=formula, needs=oracle, cost=anchored_cost))
            for mk, seed in library_members:
                at = anchored.anchored_key(mk)
                label = f"{name} {at.label} (re-anchored math parity's calibration, {key.framework}'s formula)"
                found.append(
                    cells.Cell(
                        at.label, cells.LIBRARY_ANCHORED_MEMBER, ((at, label),), member=seed, formula=formula, needs=oracle, cost=anchored_cost
                    )
                )
    return found


def member_cells(loaded: LoadedSpec, problem: Problem, seeds: list[tuple[RunKey, int]]) -> list[cells.Cell]:
    """The envelope's float32 members (whole runs), one cell each."""
    found = []
    for key, seed in seeds:
        label = f"{loaded.name} {key.label} (calibration: its sums in another order)"
        found.append(cells.Cell(key.label, cells.MEMBER, ((key, label),), member=seed, cost=problem.total_steps))
    return found


def library_member_cells(loaded: LoadedSpec, problem: Problem, keys: list[RunKey]) -> list[cells.Cell]:
    """For each framework whose library has catalogued behaviours on this spec
    (harness/known_differences.yaml), float32 members computing them: the array-module
    code, reordered as the envelope's members are, whole runs. How far they get from the
    oracle is how far those entries can explain a check (diagnosis.reach)."""
    found = []
    frameworks = dict.fromkeys(k.framework for k in keys if k.framework not in (ORACLE, CALIBRATION_KEY.framework) and k.precision != FLOAT64)
    for framework in frameworks:
        behaviour = plan.resolved(diagnosis.library_behaviour(loaded.spec, framework, keys), problem)
        if behaviour is None:
            continue
        for key, seed in plan.member_seeds(problem, FLOAT32):
            mk = RunKey(key.framework, key.device, f"as-{framework}-{key.variant}")
            label = f"{loaded.name} {mk.label} (calibration: {framework}'s catalogued behaviour, its sums in another order)"
            found.append(cells.Cell(mk.label, cells.LIBRARY32, ((mk, label),), member=seed, formula=behaviour, cost=problem.total_steps))
    return found


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
    executor=None,
) -> SpecResult:
    """Run every key on the spec, the calibration members, and the float64 twins of every
    framework and device over the first steps with the oracle's float64 members, and
    re-anchored along the run from the oracle's states (plan_cells); check every pair, and
    write one record per run (keys and twins; the members are part of the checks'
    tolerance, not records). The modes of one framework and device run in one process,
    their repeats taking turns. The cells run on `executor` (harness/run/executors.py; by
    default each in a fresh process one at a time with `isolate`, else in this process).

    With a `work_dir`, each finished cell is kept there and a later call with the same
    inputs takes it instead of running it again: a long matrix can be split over several
    calls (a time-limited GPU lease) or resumed after a crash."""
    if executor is None:  # one of its own, shut down (its kept processes ended) when done
        own = executors.Local(executors.local_plan(1, None)) if isolate else executors.Inline()
        try:
            return run_spec(loaded, problem, keys, results_dir, console, repeats, run_id, isolate, work_dir, rates, twins, own)
        finally:
            own.shutdown()
    run_id = run_id or new_id()
    planned = hosts.spread(plan_cells(loaded, problem, keys, repeats, twins), getattr(executor, "places", []))
    source = cells.source_of(loaded, problem)
    if isinstance(executor, executors.Inline):
        cells.remember(source, problem)  # this process's cells take the driver's inputs as they are

    def kept_of(planned: list[cells.Cell]) -> dict[str, dict[RunKey, Path]]:
        if work_dir is None:
            return {}
        here = {**machine(), **({"threads": executor.plan.threads} if executor.plan.threads else {})}
        at = {c.name: {**here, "place": c.place} if c.place else here for c in planned}
        return {c.name: {key: cell_path(work_dir, loaded, problem, key, c.repeats, at[c.name]) for key in c.keys} for c in planned}

    kept = kept_of(planned)

    def oracle_states(done):
        oracle = done.get(ORACLE_KEY.label, {}).get(ORACLE_KEY)
        return oracle.anchor_states if oracle is not None and oracle.status == "ok" else {}

    done = schedule.execute(planned, source, executor, console, kept, oracle_states, problem.total_steps)

    def of_role(role: str) -> list[tuple[cells.Cell, Outcome]]:
        return [(c, outcome) for c in planned if c.role == role and not hosts.is_copy(c) for outcome in done.get(c.name, {}).values()]

    def plain(c: cells.Cell, outcome: Outcome) -> Outcome:
        return calibration.in_plain_units(outcome, () if c.member is None else members.unit_orders(problem.spec, c.member))

    ran = {o.key: o for _, o in of_role(cells.FRAMEWORK)}
    outcomes = {key: ran[key] for key in keys}
    members32 = [plain(c, o) for c, o in of_role(cells.MEMBER)]
    cal32 = calibration.measure(outcomes.get(ORACLE_KEY), [outcomes.get(CALIBRATION_KEY), *members32], FLOAT32)
    members64, reference, cal64, twins_run, segments, anchored_runs, library, library_spread = [], None, None, [], None, {}, {}, {}
    if twins:
        reference = next((o for _, o in of_role(cells.REFERENCE)), None)
        members64 = [plain(c, o) for c, o in of_role(cells.MEMBER64)]
        cal64 = calibration.measure(reference, members64, FLOAT64)
        for _, outcome in of_role(cells.TWIN):
            outcomes[outcome.key] = outcome
            twins_run.append(outcome.key)
        found = [plain(c, o) for c, o in of_role(cells.ANCHORED_MEMBER)]
        if found:
            segments = calibration.measure_segments(outcomes.get(ORACLE_KEY), found)
        anchored_runs = {(o.key.framework, o.key.device): o for _, o in of_role(cells.ANCHORED_TWIN)}
        for key in twins_run:
            ref = RunKey(ORACLE, "cpu", f"as-{key.framework}")
            first = done.get(ref.label, {}).get(ref)
            if first is None:
                continue
            again = done.get(anchored.anchored_key(ref).label, {}).get(anchored.anchored_key(ref))
            library[key.framework, key.device] = (first, again)
            theirs = f"{ref.variant}-"  # the members computing that library's formula (plan_cells)
            spread = calibration.measure(first, [plain(c, o) for c, o in of_role(cells.LIBRARY_MEMBER) if o.key.variant.startswith(theirs)], FLOAT64)
            again_members = [plain(c, o) for c, o in of_role(cells.LIBRARY_ANCHORED_MEMBER) if o.key.variant.startswith(theirs)]
            segments_of = (
                calibration.measure_segments_against(again.segments, again_members, again.segment_ends, again.segment_outputs)
                if again is not None and again.status == "ok"
                else None
            )
            library_spread[key.framework, key.device] = (spread, segments_of)
    floors = {key: floor_of(problem, key, rates) for key in keys}  # each run's step against its device's floor
    library32: dict[str, list[Outcome]] = {}
    for c, o in of_role(cells.LIBRARY32):  # numpy@cpu~as-<framework>-order<i>
        library32.setdefault(o.key.variant.removeprefix("as-").rsplit("-", 1)[0], []).append(plain(c, o))
    cal = Calibration(cal32, cal64, reference, segments, anchored_runs, library, library_spread, library32)
    checks = diagnosis.verdicts(problem.spec, outcomes, cal)
    more = plan.member_seeds(problem, FLOAT32, upto=problem.spec.checks.long_run.second_look)
    doubted = diagnosis.on_rounding_alone(checks)
    if doubted and more and cal32 is not None:
        # The envelope's second look (Envelope): more members before a rounding failure stands.
        worst = max(doubted, key=lambda c: c.ratio or 0)
        console.print(
            f"  {loaded.name}: {len(doubted)} float32 checks fail on rounding alone ({worst.a.label} vs {worst.b.label}: "
            f"{worst.name}, {worst.ratio:.3g}x); measuring the envelope again with {len(more)} more members"
        )
        again = hosts.spread(member_cells(loaded, problem, more), getattr(executor, "places", []))
        found = schedule.execute(again, source, executor, console, kept_of(again), oracle_states, problem.total_steps)
        extra = [plain(c, o) for c in again if not hosts.is_copy(c) for o in found.get(c.name, {}).values()]
        wider = calibration.measure(outcomes.get(ORACLE_KEY), [outcomes.get(CALIBRATION_KEY), *members32, *extra], FLOAT32)
        if wider is not None:  # a member that failed leaves the first look's verdicts standing
            members32 = [*members32, *extra]
            cal = replace(cal, float32=wider)
            checks = diagnosis.verdicts(problem.spec, outcomes, cal)
    result = SpecResult(loaded, problem, outcomes, members32, checks, [], calibration=cal, members64=members64)
    result.cross_host = cross_host.rows(problem.spec, planned, done, cal)
    where = provenance.collect()
    made = [
        build_record(loaded, problem, outcomes[key], checks, cal, run_id, where, floors.get(key), source.inputs_sha256) for key in [*keys, *twins_run]
    ]
    result.records = [record for record, _ in made]
    if results_dir is not None:
        result.paths = write_together(results_dir, made)
    # the members, for the terminal's table: they calibrate the checks and are not written
    result.member_records = [
        build_record(loaded, problem, m, [], cal, run_id, where, None, source.inputs_sha256)[0] for m in [*members32, *members64]
    ]
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
