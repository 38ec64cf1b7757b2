"""Replace a file whole or not at all: write a temporary file in the same folder, then
rename it over the target. Only a regular file or a missing path is replaced: a FIFO, a
device (/dev/full), a symbolic link or a folder named as the target is refused, so a
command's output option cannot be turned against something that is not a plain file."""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from harness.errors import HarnessError


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


def atomic_write(path: Path, write: Callable[[BinaryIO], None]) -> None:
    """Call `write` on a new temporary file beside `path`, then rename it to `path`. A
    HarnessError naming `path`, and nothing left behind, when `path` is not a regular file
    or a missing one, or when the writing fails."""
    path = Path(path)
    ensure_replaceable(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name[:64]}.", suffix=".tmp")
    except OSError as exc:
        raise HarnessError(f"{path}: cannot write: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fchmod(f.fileno(), 0o666 & ~_umask())  # mkstemp makes it 0600
            os.fsync(f.fileno())
        ensure_replaceable(path)  # again: it may have changed while we wrote
        os.replace(tmp, path)
    except OSError as exc:
        raise HarnessError(f"{path}: cannot write: {exc.strerror or exc}") from None
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)
