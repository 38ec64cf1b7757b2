"""The harness from Python (issue 53): `harness.run_spec` runs a spec's matrix as `harness run`
does (harness/session.py, the same functions) and hands back a `Verdict`
(harness/result.py) instead of printing it.

    import harness
    verdict = harness.run_spec("specs/peaks_mlp.yaml", profile="quick", frameworks=["torch", "jax"])
    assert verdict.passed, verdict

Bad arguments raise harness.SpecError (a ValueError) with one line naming the argument and
the key, before anything runs."""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from harness import arguments, session
from harness.core.errors import SpecError
from harness.core.registry import ADAPTERS, DEVICES
from harness.execute.fresh import exit_if_importing_main
from harness.result import Verdict, rendered
from harness.spec import load as spec_load
from harness.spec.model import FULL_PROFILE


def _names(argument: str, value: Any, allowed: Sequence[str]) -> list[str] | None:
    """A list of names out of `allowed` (None: the default), else SpecError naming it."""
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list | tuple) or not value or not all(isinstance(v, str) for v in value):
        raise SpecError(f"{argument}: a list of names out of {', '.join(allowed)}, got {value!r}")
    unknown = [v for v in value if v not in allowed]
    if unknown:
        raise SpecError(f"{argument}: unknown {unknown[0]!r}; choose from {', '.join(allowed)}")
    return list(dict.fromkeys(value))


def _folder(argument: str, value: Any) -> Path | None:
    if value is None:
        return None
    if not isinstance(value, str | Path):
        raise SpecError(f"{argument}: a folder's path (str or pathlib.Path), got {type(value).__name__}")
    return Path(value)


def loaded_spec(spec: Any, profile: str) -> spec_load.LoadedSpec:
    """A spec given as a path, a spec name of specs/, or a mapping in the spec language."""
    if isinstance(spec, dict):
        return spec_load.load_mapping(spec, profile)
    if isinstance(spec, str | Path):
        return spec_load.load_spec(spec_load.resolve_spec(str(spec)), profile)
    raise SpecError(f"spec: a path, a spec's name or a dict in the spec language, got {type(spec).__name__}")


def run_loaded(loaded: spec_load.LoadedSpec, argv: list[str], members: bool = False) -> Verdict:
    """The matrix of one loaded spec under `harness run`'s options `argv`, quietly: its Verdict."""
    args = arguments.parser("harness").parse_args(["run", *argv])
    console = Console(file=io.StringIO(), width=100)
    results, _, _, _ = session.run_matrix(args, console, [loaded])
    return Verdict(results, rendered(results, members))


def run_spec(
    spec: Any,
    *,
    profile: str | None = None,
    frameworks: Sequence[str] | None = None,
    devices: Sequence[str] | None = None,
    data_dir: str | Path | None = None,
    results: str | Path | None = None,
) -> Verdict:
    """A spec's matrix, checks and verdicts, as `harness run` gives them: `spec` a path, a spec's
    name (`specs/`) or a dict in the spec language; `frameworks` and `devices` as the command
    line's --frameworks and --devices (default: every framework, the CPU); `data_dir` where
    its data files are; `results` a folder for its records (none written without it).
    Called at a script's top level, outside `if __name__ == "__main__":`, it raises
    RuntimeError saying so (its worker processes import the script again)."""
    exit_if_importing_main()
    if profile is not None and not isinstance(profile, str):
        raise SpecError(f"profile: a profile's name, got {type(profile).__name__}")
    chosen = _names("frameworks", frameworks, ADAPTERS)
    where = _names("devices", devices, DEVICES)
    data, out = _folder("data_dir", data_dir), _folder("results", results)
    loaded = loaded_spec(spec, profile or FULL_PROFILE)
    argv = ["--profile", profile or FULL_PROFILE]
    argv += ["--frameworks", ",".join(chosen)] if chosen else []
    argv += ["--devices", ",".join(where)] if where else []
    argv += ["--data-dir", str(data)] if data else []
    argv += ["--results", str(out)] if out else ["--no-records"]
    return run_loaded(loaded, argv)
