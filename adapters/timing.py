"""What the adapters' optional `rates(device, precision)` measure, and how: the float32
matrix-product rate, the memory bandwidth and, on a GPU, the time one tiny kernel adds
inside a CUDA graph, each the best of several repeats with the device synchronised.
harness/hardware/rates.py runs them in a fresh process and keeps the best over the adapters."""

from __future__ import annotations

import time

CPU_MATMUL_N = 2048
GPU_MATMUL_N = 8192
CPU_COPY_BYTES = 256 * 2**20
GPU_COPY_BYTES = 2 * 2**30
GRAPH_KERNELS = 1000
REPEATS = 7


def best_seconds(run, sync=lambda: None, repeats: int = REPEATS) -> float:
    """The fastest of `repeats` timed calls of `run`, after one untimed call."""
    run()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        sync()
        times.append(time.perf_counter() - start)
    return min(times)


def matmul_n(device: str) -> int:
    return CPU_MATMUL_N if device == "cpu" else GPU_MATMUL_N


def copy_bytes(device: str) -> int:
    return CPU_COPY_BYTES if device == "cpu" else GPU_COPY_BYTES
