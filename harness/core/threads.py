"""The array-module code's large transcendental element-wise work (tanh, exp, SciPy's erf)
split across the job's cores, bit for bit what one call computes.

An element-wise function computes each element from that element alone, so cutting a
C-contiguous array into pieces and computing the pieces on several threads gives the same
bits as one call (tests/test_threads.py holds this for every function split here, on odd
sizes, odd cuts and special values). NumPy releases the GIL inside its loops. NumPy's
float64 tanh is its own kernel (converted from Intel's SVML, dispatched on AVX2 and FMA3;
not glibc's, from which it differs by up to 2 ulps on 31% of values: docs/measurements.md,
2026-12-05), 13 to 24 ns a value on this project's VM: most of a step of `moons_net`'s
oracle (1,000 x 1,000 values), where torch's and XLA's tanh run on every core. The cheap
element-wise operations (a member's extra rounding, products and sums of arrays) are bound
by memory, and splitting them gained nothing measurable.

The frameworks' runs keep their own default threads (2 on this project's VM) unless the
executor caps them (harness.execute.capacity); so do these. Arrays under `GRAIN` elements
stay on the calling thread, as torch's element-wise loops do (at::internal::GRAIN_SIZE).
A job's process starts with OpenBLAS's threads sleeping soon after a product
(capacity.WORKER_ENVIRONMENT), or they would hold the cores these pieces run on.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

import numpy as np

Array = Any
# no piece smaller than this: torch's grain for its parallel element-wise loops
GRAIN = 32768
FLOATS = (np.dtype(np.float32), np.dtype(np.float64))

_lock = threading.Lock()
_pools: dict[tuple[int, int], ThreadPoolExecutor] = {}  # by (process, workers): a forked child has no threads


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def capped_threads() -> int | None:
    """The cap this process runs under (harness.execute.capacity.cap_threads), or None."""
    value = os.environ.get("HARNESS_THREADS")
    return int(value) if value and value.isdigit() else None


def threads() -> int:
    """The threads this process's element-wise work may use: the executor's cap, else the
    cores it may run on."""
    return capped_threads() or cores()


def _pool(workers: int) -> ThreadPoolExecutor:
    key = (os.getpid(), workers)
    with _lock:
        if key not in _pools:
            _pools[key] = ThreadPoolExecutor(workers, thread_name_prefix="harness-elementwise")
        return _pools[key]


def pieces(n: int, parts: int) -> list[tuple[int, int]]:
    """[start, stop) ranges cutting n elements into at most `parts` pieces of at least GRAIN
    each (one piece when n is smaller than two grains)."""
    parts = max(1, min(parts, n // GRAIN))
    bounds = [n * k // parts for k in range(parts + 1)]
    return list(zip(bounds[:-1], bounds[1:]))


def split(n: int, work: Callable[[int, int], None]) -> None:
    """work(start, stop) over pieces of [0, n): the first on this thread, the others on the
    pool's under this thread's NumPy error handling; returns when every piece is done, and
    raises the first failing piece's error."""
    cut = pieces(n, threads())
    if len(cut) == 1:
        work(0, n)
        return
    state = np.geterr()  # NumPy's floating-point error handling is per thread: the caller's

    def piece(start: int, stop: int) -> None:
        with np.errstate(**state):
            work(start, stop)

    futures = [_pool(len(cut) - 1).submit(piece, start, stop) for start, stop in cut[1:]]
    try:
        work(*cut[0])
    finally:  # no piece still writes once this returns or raises
        wait(futures)
    for future in futures:
        future.result()


def splittable(xp, *arrays: Array) -> bool:
    """Whether element-wise work on these arrays can be split: NumPy's floats, C-contiguous,
    of one shape and dtype, and large enough to be worth a thread."""
    first = arrays[0]
    return (
        xp is np
        and isinstance(first, np.ndarray)
        and first.dtype in FLOATS
        and first.size >= 2 * GRAIN
        and all(isinstance(a, np.ndarray) and a.flags.c_contiguous and a.shape == first.shape and a.dtype == first.dtype for a in arrays)
    )


def unary(xp, function: Callable, x: Array, out: Array | None = None) -> Array:
    """function(x), into `out` if given, for an element-wise ufunc (NumPy's tanh and exp,
    SciPy's erf): its pieces on the job's threads where x is large, the same bits as one
    call."""
    if not splittable(xp, x, *(() if out is None else (out,))):
        return function(x) if out is None else function(x, out=out)
    if out is None:
        out = np.empty_like(x)
    flat_x, flat_out = x.reshape(-1), out.reshape(-1)
    split(flat_x.size, lambda start, stop: function(flat_x[start:stop], out=flat_out[start:stop]))
    return out
