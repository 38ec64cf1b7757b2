"""What a run of the matrix takes (issue 84): `RunOptions`, one typed value, validated once
where it is made. `harness run`, `bench` and `sweep` parse their command line into it
(`from_args`); the Python API (harness/api.py run_spec, harness/port_api.py check_port)
builds it directly; harness/session.py and harness/matrix.py read it. A bad value raises
harness.SpecError (a ValueError) in one line naming the option."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.core.errors import SpecError
from harness.core.paths import RUNS_DIR, SPECS_DIR
from harness.core.registry import ADAPTERS, DEVICES, EAGER, FLOAT32, LEAST_SEEDS, MODES, PRECISION_CHOICES, REFERENCE_DEVICES
from harness.execute.capacity import LOCAL
from harness.inputs import resources
from harness.spec.fields import MAX_REPEATS
from harness.spec.model import FULL_PROFILE

MAX_SEEDS = 1000


def names(option: str, value: Any, allowed: Sequence[str]) -> tuple[str, ...] | None:
    """A list of names out of `allowed`, each once (None: the default), else SpecError naming
    the option."""
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list | tuple) or not value or not all(isinstance(v, str) for v in value):
        raise SpecError(f"{option}: a list of names out of {', '.join(allowed)}, got {value!r}")
    unknown = [v for v in value if v not in allowed]
    if unknown:
        raise SpecError(f"{option}: unknown {unknown[0]!r}; choose from {', '.join(allowed)}")
    return tuple(dict.fromkeys(value))


def folder(option: str, value: Any) -> Path | None:
    """A folder's path (None: none given), else SpecError naming the option."""
    if value is None:
        return None
    if not isinstance(value, str | Path):
        raise SpecError(f"{option}: a folder's path (str or pathlib.Path), got {type(value).__name__}")
    return Path(value)


def _count(option: str, value: Any, most: int | None = None) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1 or (most is not None and value > most):
        raise SpecError(f"{option}: a whole number from 1{f' to {most:,}' if most else ''}, got {value!r}")


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """A run of the matrix: which specs, where and how it runs, what it keeps. The defaults
    are `harness run`'s; `results` None writes no records."""

    specs: tuple[str, ...] = ()
    specs_dir: Path = SPECS_DIR
    profile: str = FULL_PROFILE
    frameworks: tuple[str, ...] | None = None  # None: every framework, each where it runs
    devices: tuple[str, ...] = ("cpu",)
    data_dir: Path | None = None
    data_source: str | None = None
    download: bool = False
    results: Path | None = RUNS_DIR
    work_dir: Path | None = None
    repeats: int | None = None  # None: the spec's
    executor: str = LOCAL
    jobs: int | None = None
    threads: int | None = None
    gpu_types: tuple[str, ...] | None = None
    places: tuple[str, ...] | None = None
    in_process: bool = False
    train_anyway: bool = False
    require_gpu: bool = False
    references: str = "cpu"
    tf32: bool = False
    precisions: tuple[str, ...] = (FLOAT32,)  # float32 always runs; bf16 adds a cell per framework that has one
    seeds: int = 1  # more: the verdict over seeds (harness/verdict/seeds.py), at least LEAST_SEEDS
    modes: tuple[str, ...] = (EAGER,)
    no_floor: bool = False
    max_memory_gb: float = resources.DEFAULT_MAX_MEMORY_GB
    max_steps: int = resources.DEFAULT_MAX_STEPS

    def __post_init__(self) -> None:
        if not isinstance(self.profile, str):
            raise SpecError(f"profile: a profile's name, got {type(self.profile).__name__}")
        set_ = lambda field, value: object.__setattr__(self, field, value)  # noqa: E731 - frozen: normalized once, here
        set_("frameworks", names("frameworks", self.frameworks, ADAPTERS))
        set_("devices", names("devices", self.devices, DEVICES) or ("cpu",))
        set_("modes", names("modes", self.modes, MODES) or (EAGER,))
        set_("precisions", names("precisions", self.precisions, PRECISION_CHOICES) or (FLOAT32,))
        for option in ("specs_dir", "data_dir", "results", "work_dir"):
            set_(option, folder(option, getattr(self, option)))
        set_("specs", tuple(self.specs))
        if self.references not in REFERENCE_DEVICES:
            raise SpecError(f"references: choose from {', '.join(REFERENCE_DEVICES)}, got {self.references!r}")
        _count("repeats", self.repeats, MAX_REPEATS)
        _count("jobs", self.jobs)
        _count("threads", self.threads)
        _count("max_steps", self.max_steps)
        _count("seeds", self.seeds, MAX_SEEDS)
        if 1 < self.seeds < LEAST_SEEDS:
            raise SpecError(f"seeds: a verdict over seeds takes at least {LEAST_SEEDS} (MLPerf's), got {self.seeds}; 1 runs none")
        for flag in ("download", "in_process", "train_anyway", "require_gpu", "tf32", "no_floor"):
            if not isinstance(getattr(self, flag), bool):
                raise SpecError(f"{flag}: True or False, got {type(getattr(self, flag)).__name__}")

    @property
    def running(self) -> list[str]:
        """The frameworks that run: those named, else every one."""
        return list(self.frameworks or ADAPTERS)

    @property
    def limits(self) -> resources.Limits:
        return resources.Limits(self.max_memory_gb, self.max_steps)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> RunOptions:
        """The options of `harness run`, `bench` or `sweep` as parsed (harness/arguments.py);
        an option a subcommand lacks keeps its default."""
        given = vars(args)
        fields = {f.name for f in dataclasses.fields(cls)} & set(given)
        options = {name: given[name] for name in fields if given[name] is not None or name in ("frameworks", "data_dir", "work_dir", "repeats")}
        if given.get("no_records"):
            options["results"] = None
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in options.items()})
