"""The matrix: one spec through the pipeline, one stage after another. Plan: the runs asked
for and the jobs calibration needs (harness/execute/plan.py, harness/calibrate/calibration.py).
Execute: the jobs on an executor (harness/execute/schedule.py, executors.py). Calibrate: the
finished jobs into the spreads that set every tolerance (harness/calibrate/calibration.py).
Judge: the checks between runs, with a diagnosis of every failing one (harness/verdict/),
and the envelope's second look where float32 fails on rounding alone. Record: one record
per run, made and written (harness/records/)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from rich.console import Console

from harness.calibrate import calibration, roles
from harness.calibrate.spread import Calibration
from harness.core import provenance
from harness.core.errors import HarnessError
from harness.core.registry import GPU_ORACLE_KEY, ORACLE_KEY, PORT_REFERENCE_KEY, CheckVerdict, RunKey, gates
from harness.execute import executors, hosts, jobs, plan, schedule
from harness.execute.jobs import inputs_sha256
from harness.hardware.floor import Floor, Rates, floor_of
from harness.inputs.problem import Problem
from harness.records import write
from harness.records.build import build_record
from harness.records.schema import Record
from harness.records.write import new_id
from harness.run import progress
from harness.run.runner import Outcome, run
from harness.spec.load import LoadedSpec
from harness.verdict import cross_host, diagnosis
from harness.verdict import seeds as over
from harness.verdict.checks import Check
from harness.verdict.parity import FORWARD

Made = tuple[Record, bytes | None]  # a record and its artifact's bytes, made to be written together


TITLE_NAMES = 160  # the longest list of a port's dropouts a title names


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
    cross_host: list[cross_host.CrossHost] = field(default_factory=list)  # runs made at several places (harness/execute/hosts.py)
    over_seeds: list = field(default_factory=list)  # the verdict over seeds' rows (harness/verdict/seeds.py OverSeeds)

    @property
    def title(self) -> str:
        """The spec's name, and a sweep point's size, or a port's dropouts turned off."""
        loaded = self.loaded
        if loaded.spec.sweep is not None and loaded.profile == loaded.spec.sweep.profile:
            return f"{loaded.name} n={len(self.problem.x_train)}"
        if self.problem.port_dropout:
            named = "; ".join(self.problem.port_dropout)
            if len(named) > TITLE_NAMES:  # a hub model's many: counted, the records name each
                torch = sum(d.startswith("torch:") for d in self.problem.port_dropout)
                named = f"{torch} modules in torch, {len(self.problem.port_dropout) - torch} in flax; the records name each"
            return f"{loaded.name}, dropout off in both frameworks ({named})"
        return loaded.name


PORT_START = "a port's start"  # the role of check_port_start's job and port_apart's


def port_apart(name: str, executor: executors.Executor | None, what: str = "module's facts") -> Callable:
    """How a port's start (`what`: its module's facts while its problem is built,
    problem.with_port's `apart`; its start check) is run apart from the driver, which never
    runs a port's file nor starts JAX's thread pool: on the inline executor in this process,
    as every run; on the local executor in the process it keeps for torch's calibration runs
    (Job.kept_group: torch's, the reference's key being torch's), where the start check and
    the members then go on as it is (a fresh process each cost a port check a process start
    and torch's import, issue 54); on any other, or none yet, in a fresh process."""
    from harness.execute.fresh import in_fresh_process

    if not isinstance(executor, executors.Inline | executors.Local):
        return in_fresh_process
    job = jobs.Job(f"{name} {what}", PORT_START, ((PORT_REFERENCE_KEY, f"{name} {what}"),), recorded=False, own_process=False)
    return lambda call, *args: executor.submit(job, call, *args).result()


def check_port_start(loaded: LoadedSpec, problem: Problem, executor: executors.Executor | None = None) -> Check:
    """A port before any run (harness/run/port_start.py check_start): torch_to_flax's tree
    against flax's own init (a PortError where they differ), then flax's float64 initial
    forward pass against torch's, diagnosed where it fails (diagnosis.start_check), where
    port_apart runs a port's start."""
    from harness.run import port_start

    outputs = port_apart(loaded.name, executor, FORWARD)(port_start.check_start, problem, loaded.port_sha256)
    return diagnosis.start_check(port_start.FLAX_TWIN_KEY, PORT_REFERENCE_KEY, outputs)


def run_cells(
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
    executor: executors.Executor | None = None,
    train_anyway: bool = False,
    seeded: Callable | None = None,
) -> SpecResult:
    """Run every key on the spec with what calibrates its checks (calibration.matrix_jobs), check every
    pair, and write one record per run (keys and float64 twins; the members are part of the
    checks' tolerance, not records). The jobs run on `executor` (harness/execute/executors.py;
    by default each in a fresh process one at a time with `isolate`, else in this process).

    With a `work_dir`, each finished job is kept there and a later call with the same
    inputs takes it instead of running it again: a long matrix can be split over several
    calls (a time-limited GPU lease) or resumed after a crash. `seeded`: the verdict over
    seeds (harness/seeded.py over_seeds, all but its driver, matrix runs and console
    given), run once the matrix is judged, its checks added to the matrix's."""
    if executor is None:  # one of its own, shut down (its kept processes ended) when done
        own = executors.Local(executors.local_slots(1, None)) if isolate else executors.Inline()
        try:
            return run_cells(loaded, problem, keys, results_dir, console, repeats, run_id, isolate, work_dir, rates, twins, own, train_anyway, seeded)
        finally:
            own.shutdown()
    early: list[Check] = []  # a port's initial forward pass, failing, where it trains anyway
    if problem.port is not None:  # no oracle nor array-module code: torch's float64 run is the reference
        keys = plan.port_keys(keys)
        if any(k.framework == "jax" for k in keys):  # the converter and the initial forward pass, before any run
            start = check_port_start(loaded, problem, executor)
            if start.verdict == CheckVerdict.FAIL:
                then = "training it anyway (--train-anyway)" if train_anyway else "nothing trains (--train-anyway trains it)"
                console.print(f"FAIL {loaded.name} {FORWARD}: {start.diagnosis}; {then}", style="red", highlight=False, soft_wrap=True)
                if not train_anyway:  # a different function needs no training to be called different: its runs skipped, saying why
                    reason = f"not trained: flax's initial forward pass differs from torch's ({FORWARD} FAIL); --train-anyway trains it"
                    skipped = {key: Outcome(key, "skipped", reason) for key in [*keys, start.a]}
                    return recorded(SpecResult(loaded, problem, skipped, [], [start], []), run_id, {}, inputs_sha256(problem), results_dir)
                early = [start]
    elif GPU_ORACLE_KEY in keys:  # the oracle and its members on the GPU (harness run --references gpu)
        problem = replace(problem, references="gpu")
    scheme = roles.scheme_of(problem)
    planned = calibration.matrix_jobs(loaded, problem, keys, repeats, twins)
    planned = hosts.spread(planned, executor.places)  # a framework job at each place asked for
    driver = schedule.Driver(loaded, problem, executor, console, work_dir)
    done = driver.run(planned)
    chosen = {o.key: o for c in planned if c.role == jobs.FRAMEWORK and not hosts.is_copy(c) for o in done.get(c.name, {}).values()}
    found = calibration.gather(planned, done, chosen, scheme)
    outcomes = {**{key: chosen[key] for key in keys}, **found.twins}

    def judged(cal: Calibration) -> list[Check]:  # every check on `cal`, after a failing initial forward pass trained anyway
        return early + diagnosis.verdicts(problem.spec, outcomes, cal)

    checks = judged(found.calibration)
    # the first look's members, of each kind a check needs on the zeroth look's spread (no member)
    first = calibration.first_look(loaded, problem, keys, planned, done, chosen, steering(checks), driver.run, console, scheme)
    if first is not None:
        planned, done, found = first
        checks = judged(found.calibration)
    # a library entry's members on the first look's, where a check needs them
    unmeasured = diagnosis.unmeasured_libraries(problem.spec, steering(checks), scheme.reference)
    measured = calibration.library_look(loaded, problem, keys, planned, done, chosen, unmeasured, driver.run, console, scheme)
    if measured is not None:
        planned, done, found = measured
        checks = judged(found.calibration)
    # the rest of the members, where a check needs them: not for one its library entries explain
    needing = [c for c in steering(checks) if not c.library_known]
    topped = calibration.top_up(loaded, problem, keys, planned, done, chosen, needing, driver.run, console, scheme)
    if topped is not None:
        planned, done, found = topped
        checks = judged(found.calibration)
    doubted = diagnosis.math_doubted(steering(checks))
    looked = calibration.math_second_look(loaded, problem, planned, done, chosen, doubted, driver.run, console, scheme)
    if looked is not None:
        planned, done, found = looked
        checks = judged(found.calibration)
    # a library entry's members, run where a check needs them
    unmeasured = diagnosis.unmeasured_libraries(problem.spec, steering(checks), scheme.reference)
    measured = calibration.library_look(loaded, problem, keys, planned, done, chosen, unmeasured, driver.run, console, scheme)
    if measured is not None:
        planned, done, found = measured
        checks = judged(found.calibration)
    beyond = diagnosis.beyond_reach(steering(checks))
    measured = calibration.library_top_up(loaded, problem, keys, planned, done, chosen, beyond, driver.run, console, scheme)
    if measured is not None:
        planned, done, found = measured
        checks = judged(found.calibration)
    alone = diagnosis.on_rounding_alone(steering(checks))
    wider = calibration.second_look(loaded, problem, planned, done, found, outcomes, alone, driver.run, console, scheme)
    if wider is not None:
        planned, done, found = wider
        checks = judged(found.calibration)
        beyond = diagnosis.beyond_reach(steering(checks))
        measured = calibration.library_top_up(loaded, problem, keys, planned, done, chosen, beyond, driver.run, console, scheme)
        if measured is not None:  # gathered again, the envelope's second look's members among them
            planned, done, found = measured
            checks = judged(found.calibration)
    whole = calibration.library_whole(loaded, problem, found, diagnosis.beyond_entries(steering(checks)), driver.run, console, scheme)
    if whole is not None:
        found, checks = whole, judged(whole.calibration)
    checks = reproduced(loaded, problem, outcomes, checks, driver.run, console)
    rows = []
    if seeded is not None:  # the cells again at other seeds, judged by their distributions
        ran = {**chosen, **{m.key: m for m in found.members if m is not None}}  # a yardstick member among them
        more, rows = seeded(lambda again, built: schedule.Driver(again, built, executor, console, None).run, ran, console, problem)
        checks = checks + more
    result = SpecResult(loaded, problem, outcomes, found.members, checks, [], calibration=found.calibration, members64=found.members64)
    result.over_seeds = rows
    result.cross_host = cross_host.rows(problem.spec, planned, done, found.calibration)
    floors = {key: floor_of(problem, key, rates) for key in keys}  # each run's step against its device's floor
    return recorded(result, run_id, floors, driver.source.inputs_sha256, results_dir)


def recorded(result: SpecResult, run_id: str | None, floors: dict[RunKey, Floor], inputs_sha256: str, results_dir: Path | None) -> SpecResult:
    """`result` with one record per run (records_of), written together where a results
    folder is given."""
    result.records, result.member_records, made = records_of(result, run_id or new_id(), floors, inputs_sha256)
    if results_dir is not None:
        result.paths = write_together(results_dir, made)
    return result


def steering(checks: list[Check]) -> list[Check]:
    """The checks that steer the looks (which members run): those that gate. A TF32 or bf16
    run's checks are measured on the members the float32 checks ran, and run none of their own."""
    return [c for c in checks if gates(c.a, c.b)]


def reproduced(loaded: LoadedSpec, problem: Problem, outcomes: dict[RunKey, Outcome], checks: list[Check], run, console: Console) -> list[Check]:
    """Before a float32 check's failure is called rounding (its twin agrees), its run is run
    once more in a fresh process (`run`: the driver's): where the two processes' losses
    differ, bit for bit, the check says `not reproducible` and from which step (JAX's
    float32 CPU run of one conv network gave other bits in another process, issue 52)."""
    keys = [k for k in diagnosis.doubted_runs(checks, problem.reference_key) if outcomes.get(k) is not None and outcomes[k].status == "ok"]
    if not keys:
        return checks
    labels = {k: f"{loaded.name} {k.label} (again, in a fresh process)" for k in keys}
    again = [jobs.Job(f"{k.label} (again)", jobs.AGAIN, ((k, labels[k]),), cost=jobs.cost(k, problem.total_steps), metrics=False) for k in keys]
    console.print(f"  {loaded.name}: float32 checks fail on rounding alone; running {', '.join(k.label for k in keys)} again in a fresh process")
    done = run(again)
    apart = {}
    for job, key in zip(again, keys):
        first, again_run = outcomes[key].losses, done.get(job.name, {}).get(key)
        second = None if again_run is None else again_run.losses
        if first is None or second is None:
            continue
        n = min(len(first), len(second))
        same = (first[:n] == second[:n]) | (np.isnan(first[:n]) & np.isnan(second[:n]))
        if not same.all() or len(first) != len(second):
            apart[key] = int(np.argmin(same)) if not same.all() else n
    return diagnosis.not_reproducible(checks, apart)


def records_of(
    result: SpecResult, run_id: str, floors: dict[RunKey, Floor], inputs_sha256: str
) -> tuple[list[Record], list[Record], list[tuple[Record, bytes | None]]]:
    """One record per run (with its artifact), with its step against its device's floor
    (`floors`, the chosen runs'); and the members', for the terminal's table: they calibrate
    the checks and are not written."""
    loaded, problem, cal, where = result.loaded, result.problem, result.calibration, provenance.collect()
    seeded = over.by_key(result.over_seeds)  # each run's final metrics seed by seed, where it ran over seeds
    made = [
        build_record(loaded, problem, outcome, result.checks, cal, run_id, where, floors.get(key), inputs_sha256, seeded.get(key))
        for key, outcome in result.outcomes.items()
    ]
    members = [build_record(loaded, problem, m, [], cal, run_id, where, None, inputs_sha256)[0] for m in [*result.members, *result.members64]]
    return [record for record, _ in made], members, made


def write_together(results_dir: Path, made: list[Made]) -> list[Path]:
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
