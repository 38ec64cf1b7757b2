"""What a machine gives a job: its cores, the thread cap a job runs under, and an
executor's choice of jobs at once and threads each (`Slots`).

A job's bits depend on its thread count: on this project's 2-core VM, torch's, NumPy's and
the oracle's moons curves differ bitwise between 1 and 2 threads (JAX's do not; see
docs/executor.md). So a job keeps the frameworks' own default threads unless the executor
runs several at once: then each job's torch, BLAS and XLA threads are capped at
cores // jobs (without a cap they oversubscribe the cores: docs/measurements.md), and the
cap is part of the job's identity (its record's `worker.threads`, its work-folder name).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from harness.core.threads import capped_threads, cores  # noqa: F401 (the executors' and workers' names)

LOCAL, RAY, INLINE = "local", "ray", "in-process"
# Ray retries a job whose worker died (killed, out of memory) this many times.
RAY_RETRIES = 2
GPU_TYPE = "gpu-type:"  # a place that is a GPU model (--gpu-types), not a custom resource


# What every job's process starts with, unless the caller's environment says otherwise.
# OpenBLAS's threads spin for 2^28 cycles (about 0.1 s) after each product by default,
# holding the cores that the array-module code's element-wise work (its tanh, exp and erf:
# harness/core/threads.py) would run on; after 2^20 (about 0.4 ms) they sleep, and a
# step's products, closer together than that, still find them awake. Waiting changes no
# bits (docs/executor.md). moons_net's oracle, 150 steps in one process, 1 against 2
# element-wise threads (2026-11-29): 4.9 / 4.8 s with the default spin; 4.8 / 3.4 s with 2^20.
#
# glibc's allocator hands large freed arrays back to the kernel (it unmaps them, or trims the
# heap's free top), so an eager step that allocates and frees its arrays takes every page of
# them from the kernel again, zeroed, at each step. With its mmap and trim thresholds at 1 GiB
# the freed memory stays in the process for the next step's arrays: the same arithmetic on the
# same values, so the same bits (the quick profile of all seven: 623 arrays bitwise), and the
# same peak memory. moons_net's NumPy float32 run (quick, 500 steps, 2026-12-05): 3.3 million
# page faults and 12.3 s against 15,560 and 4.5 s; peak RSS 75 against 77 MB (docs/executor.md).
# Other C libraries ignore the two variables.
ALLOCATOR_THRESHOLD = str(1 << 30)
WORKER_ENVIRONMENT = {
    "OPENBLAS_THREAD_TIMEOUT": "20",
    "MALLOC_MMAP_THRESHOLD_": ALLOCATOR_THRESHOLD,
    "MALLOC_TRIM_THRESHOLD_": ALLOCATOR_THRESHOLD,
}


def prepare_worker_environment() -> dict[str, str]:
    """Set WORKER_ENVIRONMENT's variables in this process's environment where they are not
    set, before it starts a job's process (a spawned child starts with it); the variables a
    Ray worker needs."""
    for name, value in WORKER_ENVIRONMENT.items():
        os.environ.setdefault(name, value)
    return {name: os.environ[name] for name in WORKER_ENVIRONMENT}


_CAPPED: int | None = None  # the cap this process set (a kept process sets it once)


def cap_threads(threads: int | None) -> None:
    """In a fresh process, before any framework starts: torch's, the BLAS libraries' and
    XLA's threads at `threads` (None: the frameworks' defaults)."""
    global _CAPPED
    if threads is None or threads == _CAPPED:  # none, or a kept process's next call
        return
    _CAPPED = threads
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS"):
        os.environ[name] = str(threads)
    flags = os.environ.get("XLA_FLAGS", "")
    extra = f"--xla_cpu_multi_thread_eigen={'false' if threads == 1 else 'true'} intra_op_parallelism_threads={threads}"
    os.environ["XLA_FLAGS"] = f"{flags} {extra}".strip()
    os.environ["HARNESS_THREADS"] = str(threads)
    from threadpoolctl import threadpool_limits  # for a BLAS loaded before this call

    threadpool_limits(limits=threads)


@dataclass
class Slots:
    """An executor's choice, said before the first job: jobs at once, threads per job."""

    kind: str
    jobs: int
    threads: int | None

    def describe(self) -> str:
        threads = "the frameworks' default threads" if self.threads is None else f"{self.threads} thread(s) each"
        return f"executor {self.kind}: {self.jobs} job(s) at a time, {threads} ({cores()} cores here)"
