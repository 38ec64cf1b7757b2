"""One call in a fresh Python process (spawned, not forked): the runs of one framework,
the GPU probe, the hardware rates. Frameworks' thread pools and GPU memory never meet (one
framework's threads slow another's in a shared process: docs/measurements.md), and on Linux
the child dies with its parent, even when the parent is killed with SIGKILL.

`Reused`: calls one after another in the same spawned processes, for work that loads no
framework and times nothing (the calibration runs of harness/execute/executors.py's Local),
where a fresh process each would cost more than the work."""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from harness.core.errors import HarnessError
from harness.execute.capacity import prepare_worker_environment

PR_SET_PDEATHSIG = 1  # linux/prctl.h


PROCESS_DIED = "the run's process died (killed, or out of memory)"  # a failed run's reason


class ProcessDied(Exception):
    """The fresh process died before it returned (killed, or out of memory)."""


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


def _submit(pool: ProcessPoolExecutor, call: Callable[..., Any], *args: Any) -> Future:
    """pool.submit, which starts the pool's processes as it needs them: each child starts
    with SIGINT blocked (a mask is inherited across exec) until _die_with_parent has set
    its default action."""
    unblocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        return pool.submit(call, *args)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, unblocked)


def _result(future: Future) -> Any:
    """A child's call's result; its exception; ProcessDied where the child died. A HarnessError
    (the user's input, refused in the child) comes as itself, its one line alone: not with the
    child's traceback chained to it (concurrent.futures' _RemoteTraceback)."""
    try:
        return future.result()
    except BrokenProcessPool:
        raise ProcessDied from None
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
    that thread's next call starts a new one: a death never fails another thread's call."""

    def __init__(self):
        self.lock = threading.Lock()
        self.pools: dict[tuple[int, Any], ProcessPoolExecutor] = {}

    def call(self, call: Callable[..., Any], *args: Any, group: Any = None) -> Any:
        me = (threading.get_ident(), group)
        with self.lock:
            pool = self.pools.get(me)
            if pool is None:
                pool = self.pools[me] = _pool()
        try:
            return _result(_submit(pool, call, *args))
        except ProcessDied:
            with self.lock:
                self.pools.pop(me, None)
            pool.shutdown(wait=False, cancel_futures=True)
            raise

    def shutdown(self) -> None:
        with self.lock:
            pools, self.pools = list(self.pools.values()), {}
        for pool in pools:
            pool.shutdown(wait=True, cancel_futures=True)
