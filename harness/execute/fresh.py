"""One call in a fresh Python process (spawned, not forked): the runs of one framework,
the GPU probe, the hardware rates. Frameworks' thread pools and GPU memory never meet (one
framework's threads slow another's in a shared process: docs/measurements.md), and on Linux
the child dies with its parent, even when the parent is killed with SIGKILL.

`Reused`: calls one after another in the same spawned processes, for work that loads no
framework and times nothing (the calibration runs of harness/execute/executors.py's Local),
where a fresh process each would cost more than the work."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from harness.core.errors import HarnessError
from harness.execute.capacity import prepare_worker_environment

PR_SET_PDEATHSIG = 1  # linux/prctl.h


PROCESS_DIED = "the run's process died (killed, or out of memory)"  # a failed run's reason


class ProcessDied(Exception):
    """The fresh process died before it returned (killed, or out of memory)."""


class UnguardedMain(RuntimeError):
    """The script that runs the harness calls it at its top level, outside `if __name__ ==
    "__main__":`: a spawned process imports the script again before it takes a call, and
    there the harness would be called again (a RuntimeError, as multiprocessing's own
    bootstrapping error is)."""


# A spawned child's exit status where the script it imports again calls the harness
# (exit_if_importing_main); a probe of the same start tells the parent so (_died).
UNGUARDED_EXIT = 86
PROBE_S = 120  # the longest the probe's start may take


def exit_if_importing_main() -> None:
    """At the top of the API's calls: in a spawned child still importing its parent's main
    script (multiprocessing's bootstrapping, the flag its own _check_not_importing_main
    reads), that script calls the harness at its top level; exit with UNGUARDED_EXIT rather
    than start a second matrix inside the first, or die of multiprocessing's error halfway."""
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        sys.exit(UNGUARDED_EXIT)


@functools.cache
def _child_start_status() -> int | None:
    """How a spawned child that does nothing ends (once a process): UNGUARDED_EXIT where
    importing the main script again calls the harness; None where it does not end in PROBE_S."""
    probe = multiprocessing.get_context("spawn").Process(target=os.getpid, daemon=True)
    with _sigint_blocked():  # Ctrl-C meanwhile ends the parent alone, without the probe's traceback
        probe.start()
    probe.join(PROBE_S)
    if probe.exitcode is None:
        probe.kill()
        probe.join()
        return None
    return probe.exitcode


def _died() -> Exception:
    """What a child's death is: UnguardedMain where every spawned child exits as it imports
    the main script again (a probe tells: run on the first death), else ProcessDied."""
    if _child_start_status() != UNGUARDED_EXIT:
        return ProcessDied()
    main = getattr(sys.modules["__main__"], "__file__", None) or "the main script"
    return UnguardedMain(
        f"{main}: calls the harness at its top level, and each worker process (multiprocessing's spawn start) imports "
        'it again there: put the call under `if __name__ == "__main__":`'
    )


def _die_with_parent(parent: int) -> None:
    """In the child, first: ask the kernel for SIGKILL when the parent goes (Linux); and
    let Ctrl-C end the child without a word: the default action, not Python's
    KeyboardInterrupt (its traceback would cross the parent's one line). SIGINT came
    blocked from the parent, so one that arrived while the child started ends it now."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the parent went before the request took effect
            os._exit(1)


def _pool() -> ProcessPoolExecutor:
    """A pool of one spawned process, which dies with this one."""
    context = multiprocessing.get_context("spawn")
    prepare_worker_environment()
    return ProcessPoolExecutor(max_workers=1, mp_context=context, initializer=_die_with_parent, initargs=(os.getpid(),))


@contextlib.contextmanager
def _sigint_blocked() -> Iterator[None]:
    """SIGINT blocked on this thread: a child started here starts with it blocked (a mask is
    inherited across exec), and ends by Ctrl-C once it sets SIGINT's action (_die_with_parent)."""
    unblocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, unblocked)


def _submit(pool: ProcessPoolExecutor, call: Callable[..., Any], *args: Any) -> Future:
    """pool.submit, which starts the pool's processes as it needs them, SIGINT blocked."""
    with _sigint_blocked():
        return pool.submit(call, *args)


def _result(future: Future) -> Any:
    """A child's call's result; its exception; where the child died, ProcessDied (or UnguardedMain:
    _died). A HarnessError
    (the user's input, refused in the child) comes as itself, its one line alone: not with the
    child's traceback chained to it (concurrent.futures' _RemoteTraceback)."""
    try:
        return future.result()
    except BrokenProcessPool:
        raise _died() from None
    except HarnessError as exc:
        raise exc from None


def in_fresh_process(call: Callable[..., Any], *args: Any) -> Any:
    """call(*args) in a new process; its result, its exception, or ProcessDied."""
    with _pool() as pool:
        return _result(_submit(pool, call, *args))


class Reused:
    """One spawned process per calling thread (an executor's job thread) and group, started on
    that thread's first call of the group and kept for its next; each dies with its parent, as
    a fresh one does. A group keeps apart what must not share a process (one framework's
    threads and another's). A process that dies fails the call it held with ProcessDied, and
    that thread's next call starts a new one: a death never fails another thread's call.
    `by_thread` False: one process per group whichever thread calls (held_processes: the
    job threads of one call are gone by the next), its calls one after another."""

    def __init__(self, by_thread: bool = True):
        self.lock = threading.Lock()
        self.by_thread = by_thread
        self.pools: dict[tuple[int | None, Any], ProcessPoolExecutor] = {}
        # Held across calls, a process is started from a thread of its own that lasts as long:
        # a child dies with the thread that started it (PR_SET_PDEATHSIG), and a call's job
        # threads end with the call.
        self.starter = None if by_thread else ThreadPoolExecutor(max_workers=1, thread_name_prefix="held")

    def call(self, call: Callable[..., Any], *args: Any, group: Any = None) -> Any:
        me = (threading.get_ident() if self.by_thread else None, group)
        with self.lock:
            pool = self.pools.get(me)
            if pool is None:
                pool = self.pools[me] = _pool()
        try:
            submitted = _submit(pool, call, *args) if self.starter is None else self.starter.submit(_submit, pool, call, *args).result()
            return _result(submitted)
        except (ProcessDied, UnguardedMain):
            with self.lock:
                self.pools.pop(me, None)
            pool.shutdown(wait=False, cancel_futures=True)
            raise

    def start(self, call: Callable[..., Any], *args: Any, group: Any = None) -> None:
        """Start the process of `group` now, if it is not yet, with call(*args) as its first
        work (imports), not waited for: it overlaps the work before the group's first call. A
        failure is the next call's (a process that died: ProcessDied)."""
        if self.starter is None:
            raise RuntimeError("Reused.start: for processes held across calls (by_thread False)")
        with self.lock:
            if (None, group) in self.pools:
                return
            pool = self.pools[None, group] = _pool()
        self.starter.submit(_submit, pool, call, *args)

    def shutdown(self) -> None:
        with self.lock:
            pools, self.pools = list(self.pools.values()), {}
        for pool in pools:
            pool.shutdown(wait=True, cancel_futures=True)
        if self.starter is not None:
            self.starter.shutdown(wait=True)


# The processes held across the harness's calls, while held_processes lasts (innermost last).
_HELD: list[Reused] = []


@contextlib.contextmanager
def held_processes() -> Iterator[Reused]:
    """While it lasts, the harness's calls that write no records (harness.check_port,
    harness.run_spec without `results`) run their jobs in worker processes held from one call
    to the next, one per framework (each such call holds its own for its length otherwise):
    each imports torch, JAX and the user's port once (a second check of the README's example
    port took seconds, its first 12-16 s: docs/measurements.md). A run again in a fresh process (the reproducibility
    look) still starts one. Its processes end when it ends. Code changed while it lasts is
    not read again by them (a port file's own bytes are: each file's content is a module of
    its own), so hold them in one test session, not across edits."""
    held = Reused(by_thread=False)
    _HELD.append(held)
    try:
        yield held
    finally:
        _HELD.remove(held)
        held.shutdown()


def held_group(adapter: str) -> tuple[str, str]:
    """The group of the process held for one adapter's jobs (Job.held_group), which
    executors.Local starts ahead of them."""
    return ("held", adapter)


def held() -> Reused | None:
    """The processes held_processes holds now, or None."""
    return _HELD[-1] if _HELD else None
