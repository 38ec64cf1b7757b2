"""The record store: the one place that reads records. It loads them (each validated
against the schema), keys them by cell, keeps the newest of each cell, labels them as the
matrix does (registry.RunKey), reads the .npz beside each (checked against the sha256 the
record names) and recovers the spec each was run with (the file it names, checked against
its sha256, else git at the record's commit). `compare`, `report`, `figures`, `speed` and
`table` all read through here.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import numpy as np
from pydantic import ValidationError

from harness.core.errors import HarnessError, RecordError, SpecError
from harness.core.files import BadNpz, npz_arrays, read_regular
from harness.core.git import checked_revision, file_at
from harness.core.paths import PROJECT_ROOT, SPECS_DIR
from harness.core.registry import ORACLE, Cell, RunKey, current_label, current_name
from harness.inputs.problem import from_named
from harness.records.schema import SCHEMA_VERSION, Record
from harness.spec import load as spec_load
from harness.spec import model as spec_mod

FRAMEWORK_PREFERENCE = ("torch", "jax", "numpy", "cupy")
OLD_CHECK_TENSOR = re.compile(r"([Wb])([1-9]\d*)")
# The largest record and artifact read. A record is tens of kilobytes (the committed ones
# reach 34 KB; its loss curve is sampled every loss_every steps); an artifact holds the
# full loss curve and the final parameters (the committed ones reach 190 KB), and 2 GiB is
# the largest IDX data file read. A record and its artifact are read only from a regular
# file, never through a link (the harness writes none; a link could lead to /dev/zero).
RECORD_MAX_BYTES = 64 * 2**20
ARTIFACT_MAX_BYTES = 2 * 2**30


class DuplicateKey(ValueError):
    """A JSON object that names a key twice (json.loads would keep the last silently)."""


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict[str, object]:
    found: dict[str, object] = {}
    for key, value in pairs:
        if key in found:
            raise DuplicateKey(key)
        found[key] = value
    return found


def read_record(path: Path) -> Record:
    """One record as written, validated against the schema: a regular file of at most
    RECORD_MAX_BYTES, JSON that names no key twice."""
    path = Path(path)
    return parse_record(read_regular(path, RECORD_MAX_BYTES, "record", follow_links=False, error=RecordError), path)


def parse_record(raw: bytes, path: str | Path) -> Record:
    """A record's bytes, read from `path` (a file, or an archive's member: named in the
    error), validated as read_record validates a file's."""
    try:
        doc = json.loads(raw, object_pairs_hook=_no_duplicates)
    except DuplicateKey as exc:
        raise RecordError(f"{path}: not a harness record (schema {SCHEMA_VERSION}): duplicate key {str(exc)!r}") from None
    except RecursionError:
        raise RecordError(f"{path}: not a harness record (schema {SCHEMA_VERSION}): (document): nested too deep") from None
    except ValueError as exc:  # not JSON, not UTF-8
        raise RecordError(f"{path}: not a harness record (schema {SCHEMA_VERSION}): (document): Invalid JSON: {exc}") from None
    try:
        return Record.model_validate(doc)
    except ValidationError as exc:
        first = exc.errors()[0]
        key = ".".join(str(p) for p in first["loc"]) or "(document)"
        raise RecordError(f"{path}: not a harness record (schema {SCHEMA_VERSION}): {key}: {first['msg']}") from None


def artifact_arrays(payload: bytes, record: Record, where: str, error: type[Exception]) -> dict[str, np.ndarray]:
    """The arrays of a record's artifact (its bytes, read from `where`), once its sha256 is
    the one the record names and it is a plain .npz (nothing unpickled); `error` saying why
    not, with `where`."""
    if hashlib.sha256(payload).hexdigest() != record.artifacts.sha256:
        raise error(f"{where}: sha256 differs from the record's; artifact not used")
    try:
        return npz_arrays(payload, ARTIFACT_MAX_BYTES)
    except BadNpz as exc:  # its sha256 matched, yet it is not an .npz the harness writes
        raise error(f"{where}: not a readable .npz ({exc})") from None


def current_tensor(name: str | None) -> str | None:
    """A check's tensor under its current name: records before 2026-11-24 said W1, b1, ...
    for dense1.weight, dense1.bias, ..."""
    old = OLD_CHECK_TENSOR.fullmatch(name or "")
    return f"dense{old[2]}.{'weight' if old[1] == 'W' else 'bias'}" if old else name


def read(path: Path) -> Record:
    """One record, validated against the schema, under its framework's and its tensors'
    current names: a record written before NumPy had its own name says `cupy` for NumPy on
    the CPU."""
    record = read_record(path)
    name = current_name(record.framework, record.device.kind)
    checks = [c.model_copy(update={"against": current_label(c.against), "tensor": current_tensor(c.tensor)}) for c in record.checks]
    return record.model_copy(update={"framework": name, "checks": checks})


def run_key(record: Record) -> RunKey:
    """The matrix cell a record was written for."""
    return RunKey(record.framework, record.device.kind, record.variant, record.precision_mode, record.mode)


def run_label(record: Record) -> str:
    """The run's label, as the terminal prints it: `torch@gpu+tf32`, `jax@cpu:fast`."""
    return run_key(record).label


def cell_of(record: Record, with_host: bool = False) -> Cell:
    """The matrix cell a record answers (registry.Cell); with its host, where records of
    several hosts are shown side by side."""
    return Cell(
        record.spec.name,
        record.spec.profile,
        json.dumps(record.spec.overrides, sort_keys=True),
        record.data.source or "",
        record.data.n_train,
        record.framework,
        record.device.kind,
        record.precision_mode,
        record.dtype,
        record.mode,
        record.host.label if with_host else "",
    )


def newest(records: Iterable[Record], with_host: bool = False) -> dict[Cell, Record]:
    """The newest record of each cell."""
    found: dict[Cell, Record] = {}
    for record in sorted(records, key=lambda r: (r.created, r.record_id)):
        found[cell_of(record, with_host)] = record
    return found


class Unavailable(Exception):
    """A figure that cannot be drawn from the records, with the reason the report states."""


def framework_rank(framework: str) -> tuple[int, str]:
    """The order frameworks are listed in: the preferred ones first, the oracle last."""
    if framework == ORACLE:
        return (len(FRAMEWORK_PREFERENCE) + 1, framework)
    if framework in FRAMEWORK_PREFERENCE:
        return (FRAMEWORK_PREFERENCE.index(framework), framework)
    return (len(FRAMEWORK_PREFERENCE), framework)


def record_order(record: Record) -> tuple:
    return (
        record.spec.name,
        record.host.label,
        record.data.n_train,
        framework_rank(record.framework),
        record.device.kind,
        record.precision_mode,
        record.mode,
        record.created,
        record.record_id,
    )


def record_paths(folder: Path) -> list[Path]:
    """The record files under folder: every .json but the schema and what hides in a dot
    folder (a report's staging folder, say)."""
    return [
        path
        for path in sorted(folder.rglob("*.json"))
        if path.name != "schema.json" and not any(part.startswith(".") for part in path.relative_to(folder).parts)
    ]


def load_records(results_dir: Path) -> dict[str, Record]:
    """Every record under results_dir, by path (relative to it); a folder without any is an error."""
    if not results_dir.is_dir():
        raise HarnessError(f"{results_dir}: no such results folder")
    found = {path.relative_to(results_dir).as_posix(): read(path) for path in record_paths(results_dir)}
    if not found:
        raise HarnessError(f"{results_dir}: no records (*.json) to report on; run `python -m harness run` first")
    return found


def newest_per_cell(records: Iterable[Record]) -> list[Record]:
    """The newest record of each cell on each host, in report order."""
    return sorted(newest(records, with_host=True).values(), key=record_order)


@dataclass
class Sources:
    """Where the records live, and the artifacts and specs already read from there."""

    results_dir: Path
    paths: dict[str, Path] = field(default_factory=dict)  # record_id -> its .json
    read: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)  # record_id -> its artifact

    @classmethod
    def scan(cls, results_dir: Path) -> tuple[Sources, list[Record]]:
        found = load_records(results_dir)
        sources = cls(results_dir, {r.record_id: results_dir / rel for rel, r in found.items()})
        return sources, list(found.values())

    def artifact(self, record: Record) -> dict[str, np.ndarray]:
        """The .npz beside a record, after checking its sha256."""
        if record.record_id not in self.read:
            self.read[record.record_id] = self._read_artifact(record)
        return self.read[record.record_id]

    def _read_artifact(self, record: Record) -> dict[str, np.ndarray]:
        if record.artifacts is None:
            raise Unavailable(f"{run_label(record)} ({record.record_id}) has no artifact ({record.status})")
        path = self.paths[record.record_id].with_name(record.artifacts.file)
        payload = read_regular(path, ARTIFACT_MAX_BYTES, "record's artifact", follow_links=False, error=Unavailable)
        return artifact_arrays(payload, record, path.name, Unavailable)

    def losses(self, record: Record) -> np.ndarray:
        return np.asarray(self.artifact(record)["losses"], dtype=np.float64)


def final_params(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every tensor of the network by name from an artifact, in float64, in the spec's layout."""
    params = {name: a.astype(np.float64) for name, a in from_named(arrays).items()}
    if not params:
        raise Unavailable("the artifact holds no final parameters")
    return params


_spec_text_at = cache(file_at)


def _spec_candidates(path: str, commit: str | None) -> Iterable[tuple[str, bytes | None]]:
    """(where, bytes) of the spec file a record names: its path, then the same name under
    specs/, then that file in git at the record's commit."""
    named = Path(path)
    local = named if named.is_absolute() else PROJECT_ROOT / named
    for candidate in dict.fromkeys([local, SPECS_DIR / named.name]):
        try:  # the path comes from the record: a missing file, a FIFO, a device or a huge file is no match
            raw = read_regular(candidate, spec_load.SPEC_MAX_BYTES, "spec file")
        except HarnessError:
            raw = None
        yield str(candidate), raw
    if commit:
        repo_path = f"specs/{named.name}"
        yield f"git {commit[:10]}:{repo_path}", _spec_text_at(commit, repo_path)


def record_spec(record: Record) -> spec_mod.Spec:
    """The spec as the record ran it (its profile's and sweep point's overrides applied)."""
    overrides = json.dumps(record.spec.overrides, sort_keys=True)
    commit = record.git.commit and checked_revision(record.git.commit, f"record {record.record_id}: git.commit")
    return _record_spec(record.spec.path, record.spec.sha256, commit, overrides)


@cache
def _record_spec(path: str, sha256: str, commit: str | None, overrides_json: str) -> spec_mod.Spec:
    for where, raw in _spec_candidates(path, commit):
        if raw is None or hashlib.sha256(raw).hexdigest() != sha256:
            continue
        try:
            doc = spec_load.parse_document(Path(where), raw.decode("utf-8"))
            extra = json.loads(overrides_json) or None
            spec, _ = spec_load.validate_document(Path(where), doc, spec_mod.FULL_PROFILE, extra)
        except (SpecError, UnicodeDecodeError) as exc:
            raise Unavailable(f"{where}: the spec no longer validates: {exc}") from None
        return spec
    raise Unavailable(f"the spec file {path} with sha256 {sha256[:12]}... is neither on disk nor in git")


@cache
def current_spec(name: str, specs_dir: Path = SPECS_DIR) -> spec_mod.Spec | None:
    """The spec file of that name in specs/ today (for its claims and its sweep)."""
    path = specs_dir / f"{name}.yaml"
    if not path.is_file():
        return None
    try:
        return spec_load.load_spec(path).spec
    except SpecError:
        return None
