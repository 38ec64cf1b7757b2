"""A spec's matrix as jobs: what each run is, what it needs, and how a worker runs it.

A job names its runs (one key, or the modes of one framework and device, whose repeats
take turns in one process), its role, its repeats, the problem it trains (the spec's, its
first steps, a calibration member's reordering, a library's formula) and the jobs whose
outcomes it takes (a re-anchored run starts from the oracle's states). It carries no
arrays: a worker rebuilds the spec's inputs from `Source` (the validated spec, its profile,
its data files' folder) and refuses them if they hash otherwise than the driver's
(`inputs_sha256`). The only arrays that travel to a worker are another job's results: the
oracle's states a re-anchored run starts from.

`run_job` is the one function an executor calls (harness/execute/executors.py), in a fresh
process of this machine or on a Ray worker; the driver alone checks and writes.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from harness.core.errors import HarnessError
from harness.core.registry import CALIBRATION, FLOAT64, ORACLE, RunKey
from harness.execute.fresh import held_group
from harness.inputs import resources
from harness.inputs.library import library_problem
from harness.inputs.members import in_plain_order, reordered
from harness.inputs.problem import Params, Problem, build_problem, truncated
from harness.run import anchored, progress
from harness.run.runner import Outcome, run_alternating
from harness.spec.load import LoadedSpec, port_source

AGAIN = "run again in a fresh process"  # the role of harness/matrix.py reproduced's jobs
FRAMEWORK = "framework run"  # the role of a chosen run (its modes together), or the calibration run; calibration's: harness/calibrate/roles.py

NO_LIMITS = resources.Limits(2.0**20, 10**18)  # GiB, steps: the driver admitted the spec already


class InputsDiffer(HarnessError):
    """A worker rebuilt inputs that hash otherwise than the driver's."""


@dataclass(frozen=True)
class Source:
    """How a worker rebuilds a spec's inputs, with no arrays: the validated spec as data,
    where its data files are, and the sha256 of the inputs the driver built."""

    name: str
    document: dict[str, Any]  # the validated spec (Spec.model_dump), profile applied
    path: str
    spec_sha256: str
    profile: str
    overrides: dict[str, Any]
    data_dir: str | None
    data_source: str | None
    step_limit: int | None
    inputs_sha256: str

    def loaded(self) -> LoadedSpec:
        from harness.spec.model import Spec

        spec = Spec.model_validate(self.document)
        port = None if spec.model.python is None else hashlib.sha256(port_source(Path(self.path), spec.model.python)).hexdigest()
        return LoadedSpec(spec=spec, path=Path(self.path), sha256=self.spec_sha256, profile=self.profile, overrides=self.overrides, port_sha256=port)


def inputs_sha256(problem: Problem) -> str:
    """The sha256 of everything a run reads from its problem: the spec, the data, the
    initial tensors, the batch order and slices, the dropout masks, the step limit."""
    digest = hashlib.sha256(problem.spec.model_dump_json().encode())
    arrays = {"x_train": problem.x_train, "y_train": problem.y_train, "x_val": problem.x_val, "y_val": problem.y_val}
    arrays |= {f"init/{k}": v for k, v in problem.initial_params.items()}
    arrays |= {f"mask/{k}": v for k, v in problem.masks.items()}
    arrays["order"] = problem.batch_order
    arrays["bounds"] = np.asarray(problem.bounds, np.int64)
    for name in sorted(arrays):
        a = arrays[name]
        if a is None:
            digest.update(f"{name}:none;".encode())
            continue
        a = np.ascontiguousarray(a)
        digest.update(f"{name}:{a.dtype.str}:{a.shape};".encode())
        digest.update(a.tobytes())
    digest.update(f"limit:{problem.step_limit};source:{problem.data_source}".encode())
    return digest.hexdigest()


def source_of(loaded: LoadedSpec, problem: Problem) -> Source:
    files = problem.data_files
    return Source(
        name=loaded.name,
        document=problem.spec.model_dump(),
        path=str(loaded.path),
        spec_sha256=loaded.sha256,
        profile=loaded.profile,
        overrides=loaded.overrides,
        data_dir=str(Path(files[0].path).parent) if files else None,
        data_source=problem.data_source,
        step_limit=problem.step_limit,
        inputs_sha256=inputs_sha256(problem),
    )


@dataclass(frozen=True)
class Job:
    """One unit of work: the runs of `labels` (key -> progress label) on a problem."""

    name: str  # unique in its matrix
    role: str
    labels: tuple[tuple[RunKey, str], ...]
    repeats: int = 1
    steps: int | None = None  # the problem's first steps only
    member: int | None = None  # a calibration member's seed (members.reordered)
    formula: Any = None  # a library's formula (harness/known_differences.yaml)
    xla_bf16_sums: bool = False  # a bf16 member rounding where JAX rounds on the CPU (Problem.xla_bf16_sums)
    needs: tuple[str, ...] = ()  # the jobs whose outcomes it takes (the oracle's, for its states)
    # the whole run (a framework job's key) whose kept first steps this job's outcome is, where
    # that run is planned beside it and kept them (math parity's reference: runner.first_steps);
    # it runs on its own only where they are not there
    reads: RunKey | None = None
    # a whole run whose metrics at the twins' last step a job reads too (a twin of its own
    # code, harness/calibrate/roles.py same_code: its record holds them)
    first_metrics: bool = False
    cost: float = 0.0  # training steps times repeats: the longest start first
    place: str | None = None  # where an executor must run it (harness/execute/ray_executor.py), if anywhere
    # the final loss and accuracy on the whole sets: what a record and the float32 envelope
    # read; math parity's reference, members and library references compare curves and
    # probe outputs only, and skip the whole-set predictions (most of a CNN member's time)
    metrics: bool = True
    recorded: bool = True  # False: a run that calibrates the checks; no record holds it, nothing times it
    # True: a process of its own (a framework's run, timed for its record; a run again in a
    # fresh process); False: a calibration's run, a float64 twin included (recorded, not timed)
    own_process: bool = True

    @property
    def keys(self) -> list[RunKey]:
        return [key for key, _ in self.labels]

    @property
    def anchored(self) -> bool:
        return bool(self.needs)

    @property
    def gpu(self) -> bool:
        return any(key.device == "gpu" for key in self.keys)

    @property
    def calibrates(self) -> bool:
        """A run no record holds and nothing times, of the array-module code on the CPU (a
        calibration member, math parity's reference, a library's reference): it loads no
        framework, so such jobs may share a worker process (executors.Local)."""
        return not self.recorded and all(key.framework in (CALIBRATION, ORACLE) and key.device == "cpu" for key in self.keys)

    @property
    def kept_group(self) -> tuple[str, ...] | None:
        """The kept process this job may run in (executors.Local), or None for a fresh one:
        a calibration's job on the CPU shares a process with the like jobs of its adapter
        (the array-module code's calibration runs; a port's torch members in float32 and
        float64, each run setting torch's flags as it needs; a framework's float64 twins over
        the first steps and re-anchored: a fresh process each was much of a port check's
        cost, docs/measurements.md "A port check's processes"); a framework's run (timed for
        its record), a run again in a fresh process or a GPU's starts a process of its own."""
        if self.calibrates:
            return ("calibration",)
        if self.own_process or self.gpu or len({k.adapter for k in self.keys}) != 1:
            return None
        return (self.keys[0].adapter,)

    @property
    def held_group(self) -> tuple[str, ...] | None:
        """The process held across calls (fresh.held_processes) a job with no kept_group runs
        in: its adapter's, so one framework's threads never meet another's; None for a run
        again in a fresh process (what it measures is a fresh process), a GPU's, or a job of
        several adapters."""
        if self.gpu or self.role == AGAIN or len({k.adapter for k in self.keys}) != 1:
            return None
        return held_group(self.keys[0].adapter)

    def problem(self, base: Problem) -> Problem:
        """This job's problem, made from the spec's."""
        p = base if self.steps is None else truncated(base, self.steps)
        if self.member is not None:
            p = reordered(p, seed=self.member)
        if self.formula is not None:
            p = library_problem(p, self.formula)
        return replace(p, xla_bf16_sums=True) if self.xla_bf16_sums else p


def cost(key: RunKey, steps: int, runs: int = 1) -> float:
    """A job's cost, to start the longest first: training steps times repeats, a float64 step twice a float32 one."""
    return steps * runs * (2.0 if key.dtype == FLOAT64 else 1.0)


@dataclass
class Finished:
    """What a worker sends back: each key's outcome, and where it ran."""

    outcomes: dict[RunKey, Outcome]
    host: dict[str, Any] = field(default_factory=dict)


# Problems built in this process, by their inputs' sha256: the driver's own when it runs
# jobs in its process (nothing is rebuilt), a worker's for the jobs it runs.
_BUILT: dict[str, Problem] = {}


def remember(source: Source, problem: Problem) -> None:
    """The problem this process's next jobs take: the driver's own, for the jobs it runs
    in its process (hashed in source_of), or one a worker rebuilt. A process keeps one
    spec's problem only: a matrix runs its specs one after another."""
    _BUILT.clear()
    _BUILT[source.inputs_sha256] = problem


def rebuilt(source: Source) -> Problem:
    """The spec's inputs, as the driver built them, or InputsDiffer."""
    found = _BUILT.get(source.inputs_sha256)
    if found is not None:
        return found
    loaded = source.loaded()
    problem = build_problem(loaded, Path(source.data_dir) if source.data_dir else None, source.data_source, False, NO_LIMITS)
    if source.step_limit is not None:
        problem = truncated(problem, source.step_limit)
    digest = inputs_sha256(problem)
    if digest != source.inputs_sha256:
        raise InputsDiffer(f"{source.name}: the inputs rebuilt here hash to {digest[:12]}, the driver's to {source.inputs_sha256[:12]}: refused")
    remember(source, problem)
    return problem


def where() -> dict[str, Any]:
    """The machine a job ran on: its fingerprint, its name, and a Ray node's id if any."""
    import platform

    from harness.core.provenance import host_fingerprint
    from harness.execute.capacity import capped_threads

    return {"hostname": platform.node(), "node": os.environ.get("HARNESS_NODE"), "threads": capped_threads(), "fingerprint": host_fingerprint()}


def in_plain_units(outcome: Outcome, unit_orders: tuple) -> Outcome:
    """A member's outcome with its tensors in the plain problem's unit order (members.reordered
    moved them): what every job hands back."""
    if not unit_orders or outcome.status != "ok":
        return outcome
    snapshots = {step: in_plain_order(p, unit_orders) for step, p in outcome.snapshots.items()}
    final = None if outcome.final_params is None else in_plain_order(outcome.final_params, unit_orders)
    ends = {a: in_plain_order(p, unit_orders) for a, p in outcome.segment_ends.items()}
    return replace(outcome, snapshots=snapshots, final_params=final, segment_ends=ends)


def run_job(source: Source, job: Job, states: dict[int, Params] | None = None, quiet: bool = False) -> Finished:
    """Run one job here: rebuild its problem, train its runs (their repeats taking turns),
    or, for a re-anchored job, every segment from `states`; a member's tensors come back in
    the plain problem's unit order."""
    problem = job.problem(rebuilt(source))
    out = progress.console()
    if job.anchored:
        (key,) = job.keys
        given = anchored.member_states(states or {}, problem) if job.member is not None else states or {}
        outcomes = {key: anchored.run_segments(problem, key, given)}
    else:
        every = problem.spec.logging.print_every
        printers = None if quiet else {key: progress.printer(out, label, problem.total_steps, every) for key, label in job.labels}
        outcomes = run_alternating(problem, job.keys, job.repeats, printers, job.metrics, job.first_metrics)
    return Finished({key: in_plain_units(outcome, problem.unit_orders) for key, outcome in outcomes.items()}, where())
