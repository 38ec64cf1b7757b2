"""A file written whole or not at all: the bytes go to a temporary file in the target's
folder, synced, then moved into place, in one of two modes:

- `replace`: renamed over the target (a report, a work-folder cell, a schema file). Only a
  regular file or a missing path is replaced: a FIFO, a device (/dev/full), a symbolic link
  or a folder named as the target is refused, so a command's output option cannot be turned
  against something that is not a plain file.
- `exclusive`: linked into place, and an existing file is never replaced (a record and its
  artifact: records are append-only).
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO, Literal

from harness.core.errors import HarnessError

Mode = Literal["replace", "exclusive"]


class AlreadyExists(HarnessError):
    """An exclusive write found the target there already."""


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def ensure_replaceable(path: Path) -> None:
    """A HarnessError unless `path` is missing or a regular file (a link is not followed)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise HarnessError(f"{path}: cannot write: {exc.strerror or exc}") from None
    if not stat.S_ISREG(mode):
        raise HarnessError(f"{path}: not a regular file; refusing to replace it")


def atomic_write(path: Path, write: Callable[[BinaryIO], None] | bytes, mode: Mode = "replace") -> None:
    """Write `write` (bytes, or a function given the open file) to `path` whole or not at
    all. A HarnessError naming `path`, and nothing left behind, when the writing fails, when
    `path` is not a regular file or a missing one (replace), or when it exists (exclusive:
    AlreadyExists)."""
    path = Path(path)
    if mode == "replace":
        ensure_replaceable(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name[:64]}.", suffix=".tmp")
    except OSError as exc:
        raise HarnessError(f"{path}: cannot write: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            if isinstance(write, bytes):
                f.write(write)
            else:
                write(f)
            f.flush()
            os.fchmod(f.fileno(), 0o666 & ~_umask())  # mkstemp makes it 0600
            os.fsync(f.fileno())
        if mode == "exclusive":
            os.link(tmp, path)  # fails, replacing nothing, where `path` exists
        else:
            ensure_replaceable(path)  # again: it may have changed while we wrote
            os.replace(tmp, path)
    except FileExistsError:
        raise AlreadyExists(f"{path}: already exists; records are never overwritten") from None
    except OSError as exc:
        raise HarnessError(f"{path}: cannot write: {exc.strerror or exc}") from None
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)
