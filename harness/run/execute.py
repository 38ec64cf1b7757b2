"""What the matrix asks before and around its jobs: whether a GPU is there (asked in a
throwaway process), the commit and host a work-folder job is named by, and that name."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from harness.core import git
from harness.core.errors import HarnessError
from harness.core.provenance import host_fingerprint
from harness.core.registry import RunKey, runs_on
from harness.inputs.problem import Problem
from harness.run.fresh import ProcessDied, in_fresh_process
from harness.run.runner import prepared_adapter
from harness.spec.load import LoadedSpec

PROCESS_DIED = "the run's process died (killed, or out of memory)"


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


def machine() -> dict[str, Any]:
    """What a work-folder job owes to where it runs: the code's commit, and the host's
    fingerprint, not its name (a fresh machine of the same kind reuses the job). Asked
    once per matrix: two git calls, /proc/cpuinfo and the BLAS libraries."""
    return {"commit": git.head()[0], "host": host_fingerprint()}


def job_path(work_dir: Path, loaded: LoadedSpec, problem: Problem, key: RunKey, repeats: int, where: dict[str, Any]) -> Path:
    """Where a finished job's outcome is kept: named by everything that makes it what it
    is (spec bytes, profile and overrides, data files, run key, repeats, and `where`, the
    machine() it runs on)."""
    facts = {
        "spec_sha256": loaded.sha256,
        "profile": loaded.profile,
        "overrides": loaded.overrides,
        "data": [f.sha256 for f in problem.data_files],
        "source": problem.data_source,
        "key": [key.framework, key.device, key.variant, key.precision, key.mode],
        "repeats": repeats,
        **where,
    }
    digest = hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()[:16]
    name = key.label
    for mark in "@+~:":
        name = name.replace(mark, "-")
    return work_dir / loaded.name / f"{name}-{digest}.json"
