"""Writing records: each validated against the schema, its .npz artifact first and then
its .json, each linked into place (harness/core/atomic.py, exclusive mode): a reader sees
a whole file or none, and a record is never overwritten."""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import os
import re
import time
import uuid
from pathlib import Path

import numpy as np
from pydantic import ValidationError

from harness.core.atomic import atomic_write
from harness.core.errors import HarnessError, RecordError
from harness.records.schema import Artifact, Record

# A record's file name (record_path), and an atomic write's temporary file (core/atomic.py).
RECORD_NAME = re.compile(r"\d{8}T\d{6}Z?_[\w-]+_(cpu|gpu)_[\w-]+_[0-9a-f]{12}\.(json|npz)")
TEMPORARY_NAME = re.compile(r"\..+\.[\w-]{8}\.tmp")
LEFTOVER_AGE_S = 600


def now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def new_id() -> str:
    return uuid.uuid4().hex[:12]


def ensure_writable(results_dir: Path, what: str = "results folder") -> None:
    """Fail before any run when the results folder (or the work folder: `what`) cannot be
    written, creating nothing: a run that then fails on its data leaves no empty folder
    behind (write_record makes it)."""
    existing = results_dir
    while not existing.exists() and existing != existing.parent:
        if existing.is_symlink():  # a link to nowhere: mkdir would fail after every run
            raise RecordError(f"{results_dir}: the {what} cannot be written: {existing} is a link to nothing")
        existing = existing.parent
    try:
        if not existing.is_dir():
            raise NotADirectoryError(20, "not a folder", str(existing))
        if existing == results_dir:
            probe = results_dir / f".write-test-{uuid.uuid4().hex}"
            probe.write_bytes(b"")
            probe.unlink()
        elif not os.access(existing, os.W_OK | os.X_OK):
            raise PermissionError(13, "Permission denied", str(existing))
    except OSError as exc:
        raise RecordError(f"{results_dir}: the {what} cannot be written: {exc.strerror or exc}") from None


def artifact_bytes(losses: np.ndarray, params, envelope: np.ndarray | None = None) -> bytes:
    """The .npz beside a record: the full loss curve, the final parameters and, for a float32
    run, the envelope that judged its curve (the relative tolerance per step)."""
    arrays = {"losses": np.asarray(losses)}
    if envelope is not None:
        arrays["envelope"] = np.asarray(envelope, dtype=np.float64)
    arrays.update(params or {})
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    return buf.getvalue()


def record_path(results_dir: Path, record: Record) -> Path:
    stamp = record.created.replace(":", "").replace("-", "").replace("+0000", "Z")
    name = f"{stamp}_{record.framework}_{record.device.kind}_{record.spec.profile}_{record.record_id}"
    return results_dir / record.spec.name / f"{name}.json"


def _write_new(path: Path, payload: bytes) -> None:
    try:
        atomic_write(path, payload, mode="exclusive")
    except HarnessError as exc:
        raise RecordError(str(exc)) from None


def sweep_leftovers(folder: Path, now: float | None = None) -> list[Path]:
    """Remove what an interrupted writer of records left in `folder` (a kill -9 between a
    record's .npz and its .json, or inside a write): a record's .npz without its .json, and
    a temporary file of an atomic write, each older than LEFTOVER_AGE_S (a writer that is
    still at work is younger). Only files of the harness's own names go; returns them."""
    now = time.time() if now is None else now
    gone = []
    for path in folder.iterdir() if folder.is_dir() else []:
        ours = (RECORD_NAME.fullmatch(path.name) and path.suffix == ".npz" and not path.with_suffix(".json").exists()) or (
            TEMPORARY_NAME.fullmatch(path.name)
        )
        if not ours or path.is_symlink() or not path.is_file():
            continue
        if now - path.stat().st_mtime > LEFTOVER_AGE_S:
            path.unlink(missing_ok=True)
            gone.append(path)
    return gone


def write_record(results_dir: Path, record: Record, artifact: bytes | None = None) -> Path:
    """Validate and write a record (and its .npz artifact first, if any)."""
    path = record_path(results_dir, record)
    path.parent.mkdir(parents=True, exist_ok=True)
    if artifact is not None:
        npz = path.with_suffix(".npz")
        _write_new(npz, artifact)
        record = record.model_copy(update={"artifacts": Artifact(file=npz.name, sha256=hashlib.sha256(artifact).hexdigest())})
    text = record.model_dump_json(indent=2) + "\n"
    try:
        Record.model_validate_json(text)
        _write_new(path, text.encode())
    except ValidationError as exc:
        _forget(path, artifact)
        raise RecordError(f"{path}: the record does not match the schema:\n{exc}") from None
    except RecordError:
        _forget(path, artifact)
        raise
    return path


def _forget(path: Path, artifact: bytes | None) -> None:
    """A record and its artifact appear together or not at all: the .npz just written goes
    when its .json cannot be."""
    if artifact is not None:
        path.with_suffix(".npz").unlink(missing_ok=True)
