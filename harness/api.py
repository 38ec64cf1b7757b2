"""The harness from Python (issue 53): `harness.run_spec` runs a spec's matrix as `harness run`
does (harness/session.py, the same functions) and hands back a `Verdict`
(harness/result.py) instead of printing it.

    import harness
    verdict = harness.run_spec("specs/peaks_mlp.yaml", profile="quick", frameworks=["torch", "jax"])
    assert verdict.passed, verdict

Bad arguments raise harness.SpecError (a ValueError) with one line naming the argument and
the key, before anything runs."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from harness import session
from harness.core.errors import SpecError
from harness.execute import fresh
from harness.execute.fresh import exit_if_importing_main
from harness.options import RunOptions
from harness.result import Verdict, rendered
from harness.spec import load as spec_load
from harness.spec.model import FULL_PROFILE


def loaded_spec(spec: Any, profile: str) -> spec_load.LoadedSpec:
    """A spec given as a path, a spec name of specs/, or a mapping in the spec language."""
    if isinstance(spec, dict):
        return spec_load.load_mapping(spec, profile)
    if isinstance(spec, str | Path):
        return spec_load.load_spec(spec_load.resolve_spec(str(spec)), profile)
    raise SpecError(f"spec: a path, a spec's name or a dict in the spec language, got {type(spec).__name__}")


def run_loaded(loaded: spec_load.LoadedSpec, options: RunOptions, members: bool = False) -> Verdict:
    """The matrix of one loaded spec under `options`, quietly: its Verdict. Where it writes no
    records (nothing is timed for one), its jobs run in a process per adapter, started at
    once and held for the call (fresh.held_processes), unless processes are held already."""
    console = Console(file=io.StringIO(), width=100)
    held = options.results is None and not options.in_process and fresh.held() is None
    with fresh.held_processes() if held else contextlib.nullcontext():
        results, _, _, _ = session.run_matrix(options, console, [loaded])
    return Verdict(results, rendered(results, members))


def run_spec(
    spec: Any,
    *,
    profile: str | None = None,
    frameworks: Sequence[str] | None = None,
    devices: Sequence[str] | None = None,
    data_dir: str | Path | None = None,
    results: str | Path | None = None,
    precisions: Sequence[str] | None = None,
    seeds: int = 1,
) -> Verdict:
    """A spec's matrix, checks and verdicts, as `harness run` gives them: `spec` a path, a spec's
    name (`specs/`) or a dict in the spec language; `frameworks`, `devices` and `precisions` as
    the command line's --frameworks, --devices and --precisions (default: every framework, the
    CPU, float32); `data_dir` where its data files are; `results` a folder for its records
    (none written without it); `seeds` as --seeds (1: none; at least 5: each framework's
    cells again at more seeds, judged by their distributions, docs/verdict.md).
    Called at a script's top level, outside `if __name__ == "__main__":`, it raises
    RuntimeError saying so (its worker processes import the script again)."""
    exit_if_importing_main()
    options = RunOptions(
        profile=FULL_PROFILE if profile is None else profile,
        frameworks=frameworks,
        devices=devices,
        data_dir=data_dir,
        results=results,
        precisions=precisions,
        seeds=seeds,
    )
    return run_loaded(loaded_spec(spec, options.profile), options)
