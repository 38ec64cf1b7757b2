"""A device's measured rates, for the floor (harness/hardware/floor.py): the float32 matrix-product
rate, the memory bandwidth and, on a GPU, the time one kernel adds inside a CUDA graph.

Each is the best over the adapters that measure rates (their optional `rates`, see
adapters/timing.py: NumPy and torch on the CPU; torch and CuPy on the GPU), measured in a
fresh process so that no framework's threads or GPU memory stay behind in the harness.
"""

from __future__ import annotations

from adapters.protocol import MeasuresRates
from adapters.timing import GRAPH_KERNELS, REPEATS, copy_bytes, matmul_n
from harness.core import registry
from harness.core.errors import HarnessError
from harness.core.registry import STRICT
from harness.execute.fresh import ProcessDied, in_fresh_process
from harness.hardware.floor import Rates


def _measure_here(device: str, precision: str) -> Rates:
    found, failed = {}, {}
    for name in registry.ADAPTERS:
        if not registry.runs_on(name, device):
            continue
        try:
            adapter = registry.load(name)
            if not isinstance(adapter, MeasuresRates):
                continue
            found[name] = adapter.rates(device, precision)
        except Exception as exc:  # a library that is absent or cannot use the device is left out
            failed[name] = f"{type(exc).__name__}: {exc}".splitlines()[0]
    if not found:
        raise HarnessError(f"cannot measure the {device}'s rates: " + "; ".join(f"{k}: {v}" for k, v in failed.items()))
    matmul = max(found, key=lambda k: found[k]["matmul"])
    copy = max(found, key=lambda k: found[k]["bandwidth"])
    launches = {k: v["launch"] for k, v in found.items() if "launch" in v}
    size, moved = matmul_n(device), copy_bytes(device) // 2**20
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


def measure(device: str, precision: str = STRICT) -> Rates:
    """The rates of this host's `device`, measured in a fresh process."""
    try:
        return in_fresh_process(_measure_here, device, precision)
    except ProcessDied:
        raise HarnessError(f"cannot measure the {device}'s rates: the process died") from None


def describe(rates: Rates) -> str:
    launch = "" if rates.launch_latency_s is None else f", {rates.launch_latency_s * 1e6:.3g} us per graph kernel"
    return f"{rates.matmul_flops_per_s / 1e9:.4g} GFLOP/s, {rates.bandwidth_bytes_per_s / 1e9:.4g} GB/s{launch}"
