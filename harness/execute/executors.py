"""Where a matrix's jobs run: this process (`--in-process`), fresh processes of this
machine (`--executor local --jobs N`, the default), or a Ray cluster (`--executor ray`).

Each is an `Executor`: `submit(job, call, *args) -> concurrent.futures.Future`, the result of
`call(*args)` (`job`, or None, says what it needs: a GPU, a place); a run whose process dies
is a failed outcome, with the reason, not a crash of the matrix. The driver
(harness/execute/schedule.py) decides what is ready to run.

Threads: harness/execute/capacity.py.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol, runtime_checkable

from harness.core.errors import HarnessError
from harness.execute.capacity import INLINE, LOCAL, RAY, Slots, cap_threads, cores
from harness.execute.fresh import Reused, held_group, in_fresh_process


@runtime_checkable
class Executor(Protocol):
    """Where jobs run: its slots (jobs at once, threads each), the places it can put a job
    (several machine kinds or labelled nodes; none for one machine), and how a job is
    submitted and the executor shut down (its kept processes ended)."""

    slots: Slots
    places: list[str]

    def submit(self, job, call: Callable[..., Any], *args: Any) -> Future: ...

    def shutdown(self) -> None: ...


def _capped(threads: int | None, call: Callable[..., Any], *args: Any) -> Any:
    cap_threads(threads)
    return call(*args)


# What a held process of each adapter imports as it starts, ahead of its first job (Local's
# `adapters`): a cold start was most of a first port check (docs/measurements.md).
WARM = {
    "torch": ("torch", "torch._inductor.config", "adapters.torch_adapter"),  # torch.use_deterministic_algorithms imports inductor's config
    "jax": ("jax", "flax.linen", "optax", "adapters.jax_adapter", "adapters.jax_port"),
    "numpy": ("adapters.xp_adapter",),
}


def _warm(adapter: str) -> None:
    for name in ("harness.run.runner", *WARM[adapter]):
        try:
            importlib.import_module(name)
        except ImportError:  # not installed: the job that needs it says so
            return


def local_slots(jobs: int | None, threads: int | None) -> Slots:
    """The default: one job at a time with the frameworks' own threads (the bits every
    record so far was made with); with --jobs N, N jobs at a time, cores // N threads
    each unless --threads says otherwise. Neither more jobs nor more threads than the
    cores: beyond them, jobs and threads only wait on each other (and their timings say so)."""
    n = cores()
    for option, value in (("--jobs", jobs), ("--threads", threads)):
        if value is not None and value > n:
            raise HarnessError(f"{option} {value}: more than this host's {n} cores (the local executor runs every job here)")
    if jobs and threads and jobs * threads > n:
        raise HarnessError(f"--jobs {jobs} --threads {threads}: {jobs * threads} threads at once, more than this host's {n} cores")
    if jobs is None:
        jobs = max(1, n // threads) if threads else 1
    if jobs > 1 and threads is None:
        threads = max(1, n // jobs)
    return Slots(LOCAL, jobs, threads)


class Inline:
    """Every job in this process, one after another (debugging; timings suffer)."""

    slots = Slots(INLINE, 1, None)
    places: list[str] = []

    def submit(self, job, call: Callable[..., Any], *args: Any) -> Future:
        future: Future = Future()
        try:
            future.set_result(call(*args))
        except BaseException as exc:  # noqa: BLE001 - handed to the driver, as a pool would
            future.set_exception(exc)
        return future

    def shutdown(self) -> None:
        pass


class Local:
    """Each job in a fresh process of this machine (harness/execute/fresh.py), `jobs` at once;
    the runs no record holds and nothing times (`Job.kept_group`: calibration members, math
    parity's references, re-anchored members) one after another in a process kept by each of
    the `jobs` job threads for each framework and precision: a fresh process each would cost
    more than such a run (docs/measurements.md), and no framework's threads meet another's."""

    places: list[str] = []

    def __init__(self, slots: Slots, held: Reused | None = None, adapters: tuple[str, ...] = ()):
        self.slots = slots
        self.pool = ThreadPoolExecutor(max_workers=slots.jobs, thread_name_prefix="job")
        self.kept = held or Reused()
        self.held = held is not None  # processes held across calls (fresh.held_processes): not this executor's to end
        for adapter in adapters if self.held else ():  # each adapter's held process started now, all at once
            held.start(_capped, slots.threads, _warm, adapter, group=held_group(adapter))

    def submit(self, job, call: Callable[..., Any], *args: Any) -> Future:
        group = None if job is None else job.kept_group
        if self.held and job is not None and job.held_group is not None:  # one process per adapter, whatever its jobs
            group = job.held_group
        if group is None:
            return self.pool.submit(in_fresh_process, _capped, self.slots.threads, call, *args)
        return self.pool.submit(self.kept.call, _capped, self.slots.threads, call, *args, group=group)

    def shutdown(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
        if not self.held:
            self.kept.shutdown()


def make(
    kind: str,
    jobs: int | None = None,
    threads: int | None = None,
    gpu_types: list[str] | None = None,
    places: list[str] | None = None,
    held: Reused | None = None,
    adapters: tuple[str, ...] = (),
) -> Executor:
    """The executor `kind` names: in-process, local, ray or ray:ADDRESS; a local one runs its
    jobs in the processes `held` across calls where given (fresh.held_processes), those of
    `adapters` started at once."""
    if kind == INLINE:
        return Inline()
    if kind == LOCAL:
        if gpu_types or places:
            raise HarnessError("--gpu-types and --places need --executor ray: the local executor has one machine")
        return Local(local_slots(jobs, threads), held, tuple(a for a in adapters if a in WARM))
    if kind == RAY or kind.startswith(f"{RAY}:"):
        from harness.execute import ray_executor

        address = kind.partition(":")[2] or None
        return ray_executor.RayExecutor(address, jobs, threads, gpu_types or [], places or [])
    raise HarnessError(f"--executor {kind}: choose local, ray or ray:ADDRESS")
