"""The GPU probe: whether a framework finds a GPU, asked in a throwaway process before any
job runs."""

from __future__ import annotations

from harness.core.errors import HarnessError
from harness.core.registry import RunKey, runs_on
from harness.execute.fresh import ProcessDied, in_fresh_process
from harness.run.runner import prepared_adapter


def _gpu_reasons(frameworks: list[str]) -> dict[str, str | None]:
    return {f: prepared_adapter(RunKey(f, "gpu"))[1] for f in frameworks if runs_on(f, "gpu")}


def require_gpu(frameworks: list[str]) -> None:
    """Stop before any run, with one line, when no framework finds a GPU. Asked in a
    throwaway process: a framework that starts on the GPU here would hold its memory."""
    try:
        reasons = in_fresh_process(_gpu_reasons, frameworks)
    except ProcessDied:
        raise HarnessError("no usable CUDA GPU: the probe's process died") from None
    if not reasons:
        raise HarnessError(f"--require-gpu: none of {', '.join(frameworks)} runs on the GPU")
    if all(reasons.values()):
        detail = "; ".join(f"{f}: {why}" for f, why in reasons.items())
        raise HarnessError(f"no usable CUDA GPU on this host ({detail})")
