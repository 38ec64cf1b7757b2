"""Running the planned cells: each group of runs in a fresh process (or this one), its
progress printed, each finished run kept in the work folder and taken from it again."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from rich.console import Console

from harness.core import git
from harness.core.errors import HarnessError
from harness.core.provenance import host_fingerprint
from harness.core.registry import RunKey, runs_on
from harness.inputs.problem import Problem
from harness.run import progress, workdir
from harness.run.fresh import ProcessDied, in_fresh_process
from harness.run.runner import Outcome, prepared_adapter, run_alternating
from harness.spec.load import LoadedSpec

GPU_MIN_REPEATS = 2
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


def _printers(out: Console, problem: Problem, labels: dict[RunKey, str]):
    every = problem.spec.logging.print_every
    return {key: progress.printer(out, label, problem.total_steps, every) for key, label in labels.items()}


def _run_child(problem: Problem, labels: dict[RunKey, str], repeats: int) -> dict[RunKey, Outcome]:
    """The body of an isolated run, in its own process."""
    return run_alternating(problem, list(labels), repeats, _printers(progress.console(), problem, labels))


def run_isolated(problem: Problem, labels: dict[RunKey, str], repeats: int) -> dict[RunKey, Outcome]:
    """The runs of `labels` (one, or the modes of one framework and device, taking turns) in
    a fresh process: frameworks' thread pools and GPU memory do not meet (torch on 2 cores
    ran 30x slower after JAX had run in the same process)."""
    try:
        return in_fresh_process(_run_child, problem, labels, repeats)
    except ProcessDied:
        return {key: Outcome(key, "failed", f"{key.label}: {PROCESS_DIED}") for key in labels}


def machine() -> dict[str, Any]:
    """What a work-folder cell owes to where it runs: the code's commit, and the host's
    fingerprint, not its name (a fresh machine of the same kind reuses the cell). Asked
    once per matrix: two git calls, /proc/cpuinfo and the BLAS libraries."""
    return {"commit": git.head()[0], "host": host_fingerprint()}


def cell_path(work_dir: Path, loaded: LoadedSpec, problem: Problem, key: RunKey, repeats: int, where: dict[str, Any]) -> Path:
    """Where a finished cell's outcome is kept: named by everything that makes it what it
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


def run_group(
    problem: Problem,
    labels: dict[RunKey, str],
    repeats: int,
    console: Console,
    isolate: bool,
    cells: dict[RunKey, Path | None],
) -> dict[RunKey, Outcome]:
    """Run the keys of `labels` together, their repeats taking turns (or take them from the
    work folder, if every one finished earlier), and keep each finished one there."""
    kept = workdir.taken(cells, console)
    if kept is not None:
        for key, cell in cells.items():
            console.print(f"[bold]{labels[key]}[/bold]: finished earlier, taken from {cell}", highlight=False)
        return kept
    steps = f"{problem.total_steps} steps, {repeats} repeat(s)"
    for key, label in labels.items():
        console.print(f"[bold]{label}[/bold] ({key.dtype}, {steps})")
    if len(labels) > 1:
        console.print(f"  their repeats take turns: {', '.join(k.label for k in labels)}", highlight=False)
    if isolate:
        outcomes = run_isolated(problem, labels, repeats)
    else:
        outcomes = run_alternating(problem, list(labels), repeats, _printers(console, problem, labels))
    for key, outcome in outcomes.items():
        name = f"{labels[key]}: " if len(labels) > 1 else ""
        if outcome.status != "ok":
            console.print(f"  {name}{outcome.status}: {outcome.reason}", style="yellow", soft_wrap=True)
        else:
            console.print(f"  {name}train {outcome.timings['train_s']:.3f} s, final loss {outcome.metrics['train_loss']:.7g} (whole training set)")
        cell = cells.get(key)
        if cell is not None and outcome.status == "ok":
            workdir.keep(cell, outcome, console)
    return outcomes
