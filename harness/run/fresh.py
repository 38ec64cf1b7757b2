"""One call in a fresh Python process (spawned, not forked): the runs of one framework,
the GPU probe, the hardware rates. Frameworks' thread pools and GPU memory never meet
(torch on 2 cores ran 30x slower after JAX had run in the same process), and on Linux the
child dies with its parent, even when the parent is killed with SIGKILL."""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

PR_SET_PDEATHSIG = 1  # linux/prctl.h


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


def in_fresh_process(call: Callable[..., Any], *args: Any) -> Any:
    """call(*args) in a new process; its result, its exception, or ProcessDied."""
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=context, initializer=_die_with_parent, initargs=(os.getpid(),)) as pool:
        # The child starts with SIGINT blocked (a mask is inherited across exec) until
        # _die_with_parent has set its default action.
        unblocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            future = pool.submit(call, *args)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, unblocked)
        try:
            return future.result()
        except BrokenProcessPool:
            raise ProcessDied from None
