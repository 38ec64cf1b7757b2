"""The work folder (`--work-dir`): finished runs kept as data, never as code.

A kept run is two files: JOB.json, its Outcome's scalars, strings and dicts with the
name of each array, and JOB.npz, the arrays (curves, snapshots, outputs, parameters).
The .json holds the .npz's sha256. Reading checks that digest, loads the arrays with
allow_pickle=False and rebuilds every field from its type annotation, so a file that does
not verify or does not parse is not used (the run goes again) and nothing in the folder is
ever unpickled or executed. The codec walks dataclasses.fields(Outcome) and each field's
type: a field added to Outcome later is handled or fails the roundtrip test.

A kept run is named by everything that makes it what it is (`job_path`): the spec's bytes,
profile and data, the run key and repeats, and where it runs (`machine`: the commit and the
host's fingerprint), so that a later call with the same inputs takes it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import types
import typing
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console

from harness.core import git
from harness.core.atomic import atomic_write
from harness.core.errors import HarnessError
from harness.core.files import BadNpz, npz_arrays, read_regular
from harness.core.provenance import host_fingerprint
from harness.core.registry import RunKey
from harness.inputs.problem import Problem
from harness.run.runner import Outcome
from harness.spec.load import LoadedSpec

FORMAT = 1
JSON_SCALARS = (str, int, float, bool, type(None))
# The largest kept run read: a .json of scalars and names (a few kilobytes) and an .npz of
# a run's arrays (its whole loss curve, snapshots, outputs, parameters), as a record and
# its artifact (harness/records/store.py). Both are the harness's own: never read through
# a link, nor from a FIFO (it would block) or a device.
CELL_MAX_BYTES = 64 * 2**20
CELL_NPZ_MAX_BYTES = 2 * 2**30


class Unusable(Exception):
    """A kept file that does not verify or does not parse: why, in a few words."""


# --- the codec: a value and its type annotation <-> JSON plus named arrays ---------------


def _optional(hint: Any) -> Any | None:
    """T of `T | None`; None for any other hint. Other unions are not supported."""
    if typing.get_origin(hint) not in (types.UnionType, typing.Union):
        return None
    others = [a for a in typing.get_args(hint) if a is not type(None)]
    if len(others) != 1:
        raise TypeError(f"unsupported union {hint}")
    return others[0]


def _item_hints(origin: Any, args: tuple, count: int) -> tuple:
    """The type of each item of a list[T], tuple[T, ...] or tuple[T1, T2] of `count` items."""
    return (args[0],) * count if origin is list or args[-1:] == (...,) else args


def _json_data(value: Any) -> Any:
    """`value` if it is JSON data (what a field typed Any may hold); tuples become lists."""
    if isinstance(value, JSON_SCALARS):
        return value
    if isinstance(value, (list, tuple)):
        return [_json_data(v) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: _json_data(v) for k, v in value.items()}
    raise TypeError(f"not JSON data: {type(value).__name__}")


def encode(value: Any, hint: Any, arrays: dict[str, np.ndarray]) -> Any:
    """`value`, of type `hint`, as JSON data; its arrays are added to `arrays` and named."""
    inner = _optional(hint)
    if inner is not None:
        return None if value is None else encode(value, inner, arrays)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return _json_data(value)
    if hint is np.ndarray:
        array = np.asarray(value)
        if array.dtype.hasobject:
            raise TypeError("an array of Python objects")
        name = f"a{len(arrays)}"
        arrays[name] = array
        return name
    if dataclasses.is_dataclass(hint):
        hints = typing.get_type_hints(hint)
        return {f.name: encode(getattr(value, f.name), hints[f.name], arrays) for f in dataclasses.fields(hint)}
    if origin is dict and args[0] is str:
        return {k: encode(v, args[1], arrays) for k, v in value.items()}
    if origin is dict:
        return [[encode(k, args[0], arrays), encode(v, args[1], arrays)] for k, v in value.items()]
    if origin in (list, tuple):
        return [encode(v, h, arrays) for v, h in zip(value, _item_hints(origin, args, len(value)), strict=True)]
    if hint in (str, int, bool):
        return hint(value)
    if hint is float:
        return float(value)
    raise TypeError(f"unsupported type {hint}")


def _expect(value: Any, kind: type | tuple[type, ...], hint: Any) -> None:
    if not isinstance(value, kind) or (isinstance(value, bool) and hint in (int, float)):
        raise Unusable(f"{hint} expected, found {type(value).__name__}")


def decode(value: Any, hint: Any, arrays: dict[str, np.ndarray]) -> Any:
    """The inverse of encode, checking each value against its type."""
    if hint is np.ndarray:
        _expect(value, str, hint)
        if value not in arrays:
            raise Unusable(f"array {value!r} missing from the .npz")
        if not isinstance(arrays[value], np.ndarray):
            raise Unusable(f"{value!r} in the .npz is not an array")
        return arrays[value]
    if hint is Any:
        return value
    inner = _optional(hint)
    if inner is not None:
        return None if value is None else decode(value, inner, arrays)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if dataclasses.is_dataclass(hint):
        hints = typing.get_type_hints(hint)
        _expect(value, dict, hint)
        if set(value) != set(hints):
            raise Unusable(f"the fields of {hint.__name__} differ")
        return hint(**{f.name: decode(value[f.name], hints[f.name], arrays) for f in dataclasses.fields(hint)})
    if origin is dict and args[0] is str:
        _expect(value, dict, hint)
        return {k: decode(v, args[1], arrays) for k, v in value.items()}
    if origin is dict:
        _expect(value, list, hint)
        if not all(isinstance(pair, list) and len(pair) == 2 for pair in value):
            raise Unusable(f"{hint}: key-value pairs expected")
        return {decode(k, args[0], arrays): decode(v, args[1], arrays) for k, v in value}
    if origin in (list, tuple):
        _expect(value, list, hint)
        items = _item_hints(origin, args, len(value))
        if len(items) != len(value):
            raise Unusable(f"{hint}: {len(value)} items")
        return origin(decode(v, h, arrays) for v, h in zip(value, items))
    if hint is float:
        _expect(value, (int, float), hint)
        try:
            return float(value)
        except OverflowError:  # an integer of 309 digits or more
            raise Unusable(f"{hint}: {str(value)[:20]}... is out of a float's range") from None
    if hint in (str, int, bool):
        _expect(value, hint, hint)
        return value
    raise TypeError(f"unsupported type {hint}")


# --- the two files of a kept run --------------------------------------------------------


def npz_path(job: Path) -> Path:
    return job.with_suffix(".npz")


def save(job: Path, outcome: Outcome) -> None:
    """Write the .npz, then the .json that names its digest (the .json last: a job whose
    .json is there is complete)."""
    arrays: dict[str, np.ndarray] = {}
    doc = {"format": FORMAT, "outcome": encode(outcome, Outcome, arrays)}
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    payload = buffer.getvalue()
    doc["npz_sha256"] = hashlib.sha256(payload).hexdigest()
    text = json.dumps(doc).encode()
    atomic_write(npz_path(job), lambda f: f.write(payload))
    atomic_write(job, lambda f: f.write(text))


def load(job: Path, key: RunKey, whole: bool = True, metrics: bool = True) -> Outcome:
    """The outcome kept in `job` for `key`; Unusable if anything does not verify or does
    not decode, whatever the content (a digest that matches says nothing of what is in
    the files: they may have been written by hand, or be incomplete)."""
    try:
        doc = json.loads(read_regular(job, CELL_MAX_BYTES, "work-folder job", follow_links=False, error=Unusable))
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise Unusable(f"not a kept run of format {FORMAT}")
        payload = read_regular(npz_path(job), CELL_NPZ_MAX_BYTES, "work-folder job", follow_links=False, error=Unusable)
        if hashlib.sha256(payload).hexdigest() != doc.get("npz_sha256"):
            raise Unusable("the .npz does not match the sha256 the .json names")
        try:
            arrays = npz_arrays(payload, CELL_NPZ_MAX_BYTES)
        except BadNpz as exc:
            raise Unusable(f"the .npz is not read: {exc}") from None
        outcome = decode(doc.get("outcome"), Outcome, arrays)
        if outcome.key != key:
            raise Unusable(f"it holds {outcome.key.label}, not {key.label}")
        if whole and outcome.status == "ok" and (outcome.losses is None or outcome.losses.size == 0):
            raise Unusable("a finished run with no loss curve")
        if whole and outcome.status == "ok" and metrics and not outcome.metrics:
            raise Unusable("a finished run without its metrics")
    except Unusable:
        raise
    except Exception as exc:  # any content that does not decode: the run goes again, never a traceback
        raise Unusable(" ".join(f"{type(exc).__name__}: {exc}".split())[:200]) from None
    return outcome


def _note(console: Console, text: str) -> None:
    console.print(text, style="yellow", soft_wrap=True, highlight=False, markup=False)


def taken(jobs: dict[RunKey, Path | None], console: Console, whole: bool = True, metrics: bool = True) -> dict[RunKey, Outcome] | None:
    """Each key's kept outcome, if every key was kept and every one verifies (a `whole`
    run's, finished, must hold its loss curve, and with `metrics` its metrics; a
    re-anchored run holds segments instead); else None (they run again). A kept run that
    does not verify gets a one-line note."""
    if not all(job is not None and job.is_file() for job in jobs.values()):
        return None
    outcomes = {}
    for key, job in jobs.items():
        try:
            outcomes[key] = load(job, key, whole, metrics)
        except Unusable as exc:
            _note(console, f"  work folder: {job} not used ({exc}); it runs again")
            return None
    return outcomes


def keep(job: Path, outcome: Outcome, console: Console) -> None:
    """Keep a finished run in the work folder; a one-line note if it cannot be."""
    try:
        save(job, outcome)
    except (HarnessError, TypeError, ValueError) as exc:
        _note(console, f"  work folder: {job} not kept: {exc}")


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
