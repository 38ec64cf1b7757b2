"""A device's measured rates, for the floor (harness/floor.py): the float32 matrix-product
rate, the memory bandwidth and, on a GPU, the time one kernel adds inside a CUDA graph.

Each is the best over the libraries present (NumPy and torch on the CPU; torch and CuPy on
the GPU), timed with the device synchronised, the best of several repeats, in a fresh
process so that no framework's threads or GPU memory stay behind in the harness.
"""

from __future__ import annotations

import os
import time

from harness.errors import HarnessError
from harness.floor import Rates
from harness.fresh import ProcessDied, in_fresh_process

CPU_MATMUL_N = 2048
GPU_MATMUL_N = 8192
CPU_COPY_BYTES = 256 * 2**20
GPU_COPY_BYTES = 2 * 2**30
GRAPH_KERNELS = 1000
REPEATS = 7


def _best_seconds(run, sync=lambda: None, repeats: int = REPEATS) -> float:
    run()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        sync()
        times.append(time.perf_counter() - start)
    return min(times)


def _numpy_rates() -> dict[str, float]:
    import numpy as np

    n = CPU_MATMUL_N
    a = np.random.default_rng(0).random((n, n), dtype=np.float32)
    out = np.empty_like(a)
    matmul = 2 * n**3 / _best_seconds(lambda: np.matmul(a, a, out=out))
    src = np.ones(CPU_COPY_BYTES // 4, dtype=np.float32)
    dst = np.empty_like(src)
    copy = 2 * src.nbytes / _best_seconds(lambda: np.copyto(dst, src))
    return {"matmul": matmul, "bandwidth": copy}


def _torch_cpu_rates() -> dict[str, float]:
    import torch

    n = CPU_MATMUL_N
    a = torch.rand(n, n)
    out = torch.empty_like(a)
    matmul = 2 * n**3 / _best_seconds(lambda: torch.mm(a, a, out=out))
    src = torch.ones(CPU_COPY_BYTES // 4)
    dst = torch.empty_like(src)
    copy = 2 * src.numel() * 4 / _best_seconds(lambda: dst.copy_(src))
    return {"matmul": matmul, "bandwidth": copy}


def _torch_gpu_rates(precision: str) -> dict[str, float]:
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("no CUDA device")
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    sync = torch.cuda.synchronize
    n = GPU_MATMUL_N
    a = torch.rand(n, n, device="cuda")
    out = torch.empty_like(a)
    matmul = 2 * n**3 / _best_seconds(lambda: torch.mm(a, a, out=out), sync)
    src = torch.ones(GPU_COPY_BYTES // 4, device="cuda")
    dst = torch.empty_like(src)
    copy = 2 * src.numel() * 4 / _best_seconds(lambda: dst.copy_(src), sync)
    x = torch.zeros(1, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        x.add_(1)  # warm the kernel before capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(GRAPH_KERNELS):
            x.add_(1)
    launch = _best_seconds(graph.replay, sync) / GRAPH_KERNELS
    return {"matmul": matmul, "bandwidth": copy, "launch": launch}


def _cupy_gpu_rates(precision: str) -> dict[str, float]:
    os.environ["CUPY_TF32"] = "1" if precision == "tf32" else "0"
    import cupy

    if not cupy.is_available():
        raise RuntimeError("no CUDA device")
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        sync = stream.synchronize
        n = GPU_MATMUL_N
        a = cupy.random.random((n, n), dtype=cupy.float32)
        out = cupy.empty_like(a)
        matmul = 2 * n**3 / _best_seconds(lambda: cupy.matmul(a, a, out=out), sync)
        src = cupy.ones(GPU_COPY_BYTES // 4, dtype=cupy.float32)
        dst = cupy.empty_like(src)
        copy = 2 * src.nbytes / _best_seconds(lambda: cupy.copyto(dst, src), sync)
        x = cupy.zeros(1, dtype=cupy.float32)
        x += 1  # compile the kernel before capture
        stream.synchronize()
        stream.begin_capture()
        for _ in range(GRAPH_KERNELS):
            x += 1
        graph = stream.end_capture()
        launch = _best_seconds(lambda: graph.launch(stream), sync) / GRAPH_KERNELS
    return {"matmul": matmul, "bandwidth": copy, "launch": launch}


def _measure_here(device: str, precision: str) -> Rates:
    if device == "cpu":
        probes = {"numpy": _numpy_rates, "torch": _torch_cpu_rates}
    else:
        probes = {"torch": lambda: _torch_gpu_rates(precision), "cupy": lambda: _cupy_gpu_rates(precision)}
    found, failed = {}, {}
    for name, probe in probes.items():
        try:
            found[name] = probe()
        except Exception as exc:  # a library that is absent or cannot use the device is left out
            failed[name] = f"{type(exc).__name__}: {exc}".splitlines()[0]
    if not found:
        raise HarnessError(f"cannot measure the {device}'s rates: " + "; ".join(f"{k}: {v}" for k, v in failed.items()))
    matmul = max(found, key=lambda k: found[k]["matmul"])
    copy = max(found, key=lambda k: found[k]["bandwidth"])
    launches = {k: v["launch"] for k, v in found.items() if "launch" in v}
    size = CPU_MATMUL_N if device == "cpu" else GPU_MATMUL_N
    moved = (CPU_COPY_BYTES if device == "cpu" else GPU_COPY_BYTES) // 2**20
    parts = [
        f"float32 matmul {size}^2 ({precision}): " + ", ".join(f"{k} {v['matmul'] / 1e9:.4g} GFLOP/s" for k, v in found.items()),
        f"copy of {moved} MiB (read + write): " + ", ".join(f"{k} {v['bandwidth'] / 1e9:.4g} GB/s" for k, v in found.items()),
    ]
    if launches:
        parts.append(f"{GRAPH_KERNELS} tiny kernels in one CUDA graph: " + ", ".join(f"{k} {v * 1e6:.3g} us each" for k, v in launches.items()))
    parts += [f"{k} not measured ({v})" for k, v in failed.items()]
    return Rates(
        matmul_flops_per_s=found[matmul]["matmul"],
        bandwidth_bytes_per_s=found[copy]["bandwidth"],
        launch_latency_s=min(launches.values()) if launches else None,
        measured_with="; ".join(parts) + f"; best of {REPEATS} each",
    )


def measure(device: str, precision: str = "strict") -> Rates:
    """The rates of this host's `device`, measured in a fresh process."""
    try:
        return in_fresh_process(_measure_here, device, precision)
    except ProcessDied:
        raise HarnessError(f"cannot measure the {device}'s rates: the process died") from None


def describe(rates: Rates) -> str:
    launch = "" if rates.launch_latency_s is None else f", {rates.launch_latency_s * 1e6:.3g} us per graph kernel"
    return f"{rates.matmul_flops_per_s / 1e9:.4g} GFLOP/s, {rates.bandwidth_bytes_per_s / 1e9:.4g} GB/s{launch}"

