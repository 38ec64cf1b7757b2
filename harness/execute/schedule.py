"""The driver's loop: submit each job whose needs are met to the executor, the longest
first; take a job from the work folder instead where every run of it finished earlier;
gather what comes back and keep each finished run there. The driver alone writes: the
work folder here, the records in harness/matrix.py.

On a local executor at most one GPU job runs at a time: two would share one GPU and each
other's timings."""

from __future__ import annotations

import contextlib
import functools
import signal
import threading
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from harness.core.registry import BF16, RunKey
from harness.execute import workdir
from harness.execute.capacity import RAY
from harness.execute.executors import Inline
from harness.execute.fresh import PROCESS_DIED, ProcessDied, UnguardedMain
from harness.execute.jobs import Finished, Job, Source, remember, run_job, source_of
from harness.execute.workdir import job_path, machine
from harness.inputs.problem import Problem
from harness.run import anchored
from harness.run.runner import Outcome, first_steps
from harness.spec.load import LoadedSpec


def _announce(console: Console, job: Job, steps: int, segments: int = 0) -> None:
    """A job's runs as it starts: `steps` of each (a re-anchored job: of each of its
    `segments`), the line tools/timings.py reads."""
    for key, label in job.labels:
        if job.anchored:
            console.print(f"[bold]{label}[/bold] ({key.dtype}, {segments * steps} steps, {job.repeats} repeat(s): {segments} re-anchored segments)")
        else:
            console.print(f"[bold]{label}[/bold] ({BF16 if key.precision == BF16 else key.dtype}, {steps} steps, {job.repeats} repeat(s))")
    if len(job.labels) > 1:
        console.print(f"  their repeats take turns: {', '.join(k.label for k in job.keys)}", highlight=False)


def _report(console: Console, job: Job, outcomes: dict[RunKey, Outcome]) -> None:
    labels = dict(job.labels)
    for key, outcome in outcomes.items():
        name = f"{labels[key]}: " if len(labels) > 1 else ""
        if outcome.status != "ok":
            console.print(f"  {name}{outcome.status}: {outcome.reason}", style="yellow", soft_wrap=True)
        elif job.anchored:
            console.print(f"  {name}train {outcome.timings.get('train_s', 0.0):.3f} s, {len(outcome.segments)} segments", highlight=False)
        elif "train_loss" in outcome.metrics:
            console.print(f"  {name}train {outcome.timings['train_s']:.3f} s, final loss {outcome.metrics['train_loss']:.7g} (whole training set)")
        else:
            console.print(f"  {name}train {outcome.timings['train_s']:.3f} s, last logged loss {outcome.losses[-1]:.7g}", highlight=False)


def _died(job: Job, reason: str) -> dict[RunKey, Outcome]:
    return {key: Outcome(key, "failed", f"{key.label}: {reason}") for key in job.keys}


class _Interrupt:
    """Ctrl-C (or a lease's INT) as a flag that the driver turns into KeyboardInterrupt
    between its waits. Raised inside concurrent.futures.wait's lock handling, the interrupt
    surfaced as `RuntimeError: release unlocked lock` instead (the first GPU contact's port
    phase), and the CLI, which keeps the finished runs on KeyboardInterrupt, printed a
    traceback. Jobs run in this process (Inline) keep Python's own handler: they are
    interrupted where they are, as before."""

    def __init__(self) -> None:
        self.hit = False

    def check(self) -> None:
        if self.hit:
            raise KeyboardInterrupt

    @contextlib.contextmanager
    def between_waits(self, inline: bool) -> Iterator[_Interrupt]:
        own = not inline and threading.current_thread() is threading.main_thread()
        if not own or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
            yield self
            return
        previous = signal.signal(signal.SIGINT, self._flag)
        try:
            yield self
        finally:
            signal.signal(signal.SIGINT, previous)

    def _flag(self, *_: object) -> None:
        self.hit = True


def execute(
    jobs: list[Job],
    source: Source,
    executor,
    console: Console,
    kept: dict[str, dict[RunKey, Path]] | None = None,
    states: Any = None,
    total_steps: int = 0,
    finished: dict[str, dict[RunKey, Outcome]] | None = None,
) -> dict[str, dict[RunKey, Outcome]]:
    """Run `jobs` on `executor`; each job's outcomes by its name, with those of `finished`,
    jobs run earlier that `jobs` may need. `kept`: each job's work-folder files by key.
    `states(done)`: the states a re-anchored job starts from, given the finished jobs (the
    oracle's); a job that needs states there are none of is not run. A job that raises or
    whose process dies fails its runs, with the reason. Ctrl-C is a KeyboardInterrupt, also
    where it ends the last job's process (the jobs finished before it are kept)."""
    kept = kept or {}
    done: dict[str, dict[RunKey, Outcome]] = dict(finished or {})
    waiting = sorted(jobs, key=lambda c: -c.cost)
    running: dict[Future, Job] = {}
    local = executor.slots.kind != RAY  # Ray places and queues jobs itself

    planned = {c.name for c in jobs} | set(done)

    def waits_on(job: Job) -> tuple[str, ...]:  # a job that reads a run's first steps waits for it where it is planned
        read = () if job.reads is None or job.reads.label not in planned else (job.reads.label,)
        return (*job.needs, *read)

    def start(job: Job) -> None:
        files = kept.get(job.name)
        if files and len(files) == len(job.labels):
            found = workdir.taken(files, console, not job.anchored, job.metrics)
            if found is not None:
                for key, label in job.labels:
                    console.print(f"[bold]{label}[/bold]: finished earlier, taken from {files[key]}", highlight=False)
                done[job.name] = found
                return
        if job.reads is not None:  # the reference's whole run kept its first steps (and segment ends)
            whole = done.get(job.reads.label, {}).get(job.reads)
            (key, label), *_ = job.labels
            read = None if whole is None or whole.status != "ok" else _read(job, whole, key, source, total_steps)
            if read is not None:
                kept_there = "segment ends" if job.anchored else "first steps"
                console.print(f"[bold]{label}[/bold]: read from {job.reads.label}'s whole run, which kept its {kept_there}", highlight=False)
                finish(job, {key: read})
                return
        given = None
        if job.anchored:
            given = states(done) if states else {}
            if not given:
                done[job.name] = {}
                return
        if job.anchored:  # each segment is math_parity.steps long (Problem.anchors: whole ones)
            _announce(console, job, source.document["checks"]["math_parity"]["steps"], len(given))
        else:
            _announce(console, job, job.steps or total_steps)
        running[executor.submit(job, run_job, source, job, given)] = job

    def finish(job: Job, outcomes: dict[RunKey, Outcome]) -> None:
        done[job.name] = outcomes
        for key, outcome in outcomes.items():
            path = kept.get(job.name, {}).get(key)
            if path is not None and outcome.status == "ok":
                workdir.keep(path, outcome, console)

    with _Interrupt().between_waits(isinstance(executor, Inline)) as interrupt:
        while waiting or running:
            interrupt.check()
            gpu_busy = local and any(c.gpu for c in running.values())
            for job in list(waiting):
                if not all(n in done for n in waits_on(job)):
                    continue
                if job.gpu and gpu_busy:
                    continue
                if local and len(running) >= executor.slots.jobs:
                    break
                waiting.remove(job)
                start(job)
                gpu_busy = local and any(c.gpu for c in running.values())
            if not running:
                if waiting and not any(all(n in done for n in waits_on(c)) for c in waiting):
                    raise RuntimeError("jobs wait on jobs that never run")  # a planning bug, never an input
                continue
            finished, _ = wait(list(running), timeout=0.25, return_when=FIRST_COMPLETED)
            for future in finished:
                job = running.pop(future)
                try:
                    result: Finished = future.result()
                    outcomes = result.outcomes
                    for outcome in outcomes.values():
                        outcome.worker = result.host
                except ProcessDied:
                    if interrupt.hit:  # its process got the same INT (its process group's): no failure to report
                        continue
                    outcomes = _died(job, PROCESS_DIED)
                except UnguardedMain:  # every job's process would end so: the caller's script is at fault
                    raise
                except Exception as exc:  # the job raised in its worker (inputs refused, an executor's error)
                    outcomes = _died(job, " ".join(str(exc).split())[:300] or type(exc).__name__)
                _report(console, job, outcomes)
                finish(job, outcomes)
        interrupt.check()  # the last job's process ended by the same INT: no outcome of it, which the caller needs
    return done


def _read(job: Job, whole: Outcome, key: RunKey, source: Source, total_steps: int) -> Outcome | None:
    """`job`'s outcome read from the whole run it reads (Job.reads), or None: its first steps
    (math parity's reference, or a twin of the reference's own code), or its segments."""
    if job.anchored:
        read = anchored.segments_read(whole, key, source.document["checks"]["math_parity"]["steps"])
    else:
        read = first_steps(whole, key, job.steps or total_steps, metrics=job.metrics)
    if read is not None:
        read.worker = dict(whole.worker)  # where its bits were computed
        if key.framework != job.reads.framework:  # a twin: its record says whose run it is
            read.describe["read_from"] = job.reads.label
    return read


@dataclass
class Driver:
    """A spec's jobs on an executor: `run(jobs, finished)` runs them (execute) with the spec's
    inputs (`source`), each finished job kept in the work folder if there is one, a
    re-anchored job given the oracle's states; each job's outcomes by its name."""

    loaded: LoadedSpec
    problem: Problem
    executor: object
    console: Console
    work_dir: Path | None

    def __post_init__(self) -> None:
        self.source = source_of(self.loaded, self.problem)
        if isinstance(self.executor, Inline):
            remember(self.source, self.problem)  # this process's jobs take the driver's inputs as they are

    def run(self, jobs: list[Job], finished: dict[str, dict[RunKey, Outcome]] | None = None) -> dict[str, dict[RunKey, Outcome]]:
        kept = self.kept(jobs)
        states = functools.partial(reference_states, self.problem.reference_key)
        return execute(jobs, self.source, self.executor, self.console, kept, states, self.problem.total_steps, finished)

    def kept(self, jobs: list[Job]) -> dict[str, dict[RunKey, Path]]:
        """Each job's work-folder files, by key."""
        if self.work_dir is None:
            return {}
        threads = self.executor.slots.threads
        here = {**machine(), **({"threads": threads} if threads else {})}
        at = {c.name: {**here, "place": c.place} if c.place else here for c in jobs}
        return {c.name: {key: job_path(self.work_dir, self.loaded, self.problem, key, c.repeats, at[c.name]) for key in c.keys} for c in jobs}


def reference_states(reference: RunKey, done: dict[str, dict[RunKey, Outcome]]) -> dict:
    """The states a re-anchored job starts from: the reference's (the oracle's, or a
    port's torch float64 run's), once it finished."""
    found = done.get(reference.label, {}).get(reference)
    return found.anchor_states if found is not None and found.status == "ok" else {}
