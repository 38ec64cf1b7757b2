"""Reading a file that anyone could have put there (a spec, a record, its artifact, a
work-folder cell): only a regular file, only up to a limit, never blocking.

- read_regular: a FIFO named as the file would block the reader forever, a device
  (/dev/zero, or a link to it) never ends, and a file of gigabytes exhausts memory. The
  file is opened without blocking (O_NONBLOCK) and, for the harness's own files, without
  following a link (O_NOFOLLOW); the open file is checked with fstat (a regular file, of
  at most `limit` bytes) and at most limit + 1 bytes are read, so a file that grows while
  it is read, or one whose size says 0 (/proc), is caught as well.
- npz_arrays: the arrays of an .npz held in memory, read as numpy reads them with
  allow_pickle=False, once every member is checked: a .npy of a plain numeric dtype whose
  header's shape makes exactly the bytes the member holds. numpy allocates what a header
  says before reading: a crafted header asked for terabytes.
"""

from __future__ import annotations

import io
import math
import os
import stat
import zipfile
from pathlib import Path
from typing import BinaryIO

import numpy as np

from harness.core.errors import HarnessError

READ_CHUNK = 1 << 20
# The most a deflate stream can expand (zlib's technical notes: 1032:1), for gzip files
# and .npz members: a header that asks for more than its compressed bytes can hold lies.
DEFLATE_MAX_RATIO = 1032
NPZ_DTYPE_KINDS = "biuf"  # bool, int, unsigned, float: what the harness stores in an .npz
NPZ_MAX_HEADER = 10_000  # numpy's own default limit on a .npy header, in bytes


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISLNK, "a symbolic link"),
    ):
        if test(mode):
            return name
    return "an unknown kind of file"


def _refuse(path: Path, mode: int, what: str, error: type[Exception]) -> Exception:
    return error(f"{path}: {_kind(mode)}, not a regular file; a {what} is read only from a regular file")


def open_regular(path: str | Path, what: str, *, follow_links: bool = True, error: type[Exception] = HarnessError) -> tuple[BinaryIO, int]:
    """`path` open for reading (unbuffered), and its size, once it is found to be a regular
    file; else `error` with one line naming the file ("{path}: ..."). `what` names the file
    in the message ("spec file", "record"). With follow_links False, a symbolic link is
    refused too (the files the harness writes itself are never links)."""
    path = Path(path)
    try:
        mode = (os.stat if follow_links else os.lstat)(path).st_mode
        if not stat.S_ISREG(mode):  # refused before it is opened: opening a device can act
            raise _refuse(path, mode, what, error)
        flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | (0 if follow_links else os.O_NOFOLLOW)
        fd = os.open(path, flags)
    except OSError as exc:
        raise error(f"{path}: cannot read the {what}: {exc.strerror or exc}") from None
    f = os.fdopen(fd, "rb", buffering=0)
    try:
        found = os.fstat(fd)  # the file opened, which may not be the one stat saw
    except OSError as exc:
        f.close()
        raise error(f"{path}: cannot read the {what}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(found.st_mode):
        f.close()
        raise _refuse(path, found.st_mode, what, error)
    return f, found.st_size


def read_regular(path: str | Path, limit: int, what: str, *, follow_links: bool = True, error: type[Exception] = HarnessError) -> bytes:
    """The bytes of `path`, a regular file (open_regular) of at most `limit` bytes, else
    `error` with one line naming the file. At most limit + 1 bytes are read."""
    path = Path(path)
    f, size = open_regular(path, what, follow_links=follow_links, error=error)
    with f:
        if size > limit:
            raise error(f"{path}: {size:,} bytes, more than the {limit:,} a {what} may have")
        chunks, got = [], 0
        hint = size + 1  # one read for a file of the size fstat gave, one more to see its end
        try:
            while got <= limit:
                chunk = f.read(min(limit + 1 - got, max(hint - got, READ_CHUNK)))
                if not chunk:
                    break
                chunks.append(chunk)
                got += len(chunk)
        except OSError as exc:
            raise error(f"{path}: cannot read the {what}: {exc.strerror or exc}") from None
    if got > limit:
        raise error(f"{path}: more than the {limit:,} bytes a {what} may have")
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _check_npz_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, payload_size: int) -> int:
    """The bytes `info` unpacks to, once its .npy header is read and found to agree with
    them; ValueError saying why not."""
    if not info.filename.endswith(".npy"):
        raise ValueError(f"member {info.filename!r} is not a .npy array")
    if info.compress_size > payload_size or info.file_size > DEFLATE_MAX_RATIO * info.compress_size + 1024:
        raise ValueError(f"member {info.filename!r} claims {info.file_size:,} bytes from {info.compress_size:,}")
    with archive.open(info) as member:
        version = np.lib.format.read_magic(member)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(member, max_header_size=NPZ_MAX_HEADER)
        elif version == (2, 0):
            shape, _, dtype = np.lib.format.read_array_header_2_0(member, max_header_size=NPZ_MAX_HEADER)
        else:
            raise ValueError(f"member {info.filename!r}: .npy format {version} is not read")
        header = member.tell()
    if dtype.kind not in NPZ_DTYPE_KINDS or dtype.hasobject or dtype.fields is not None or dtype.subdtype is not None:
        raise ValueError(f"member {info.filename!r}: dtype {dtype} is not a plain number")
    expected = math.prod(shape) * dtype.itemsize  # Python ints: no overflow
    if header + expected != info.file_size:
        raise ValueError(f"member {info.filename!r}: its header says {shape} {dtype} ({expected:,} bytes), it holds {info.file_size - header:,}")
    return info.file_size


class BadNpz(ValueError):
    """An .npz that is not read: why, in a few words."""


def npz_arrays(payload: bytes, limit: int) -> dict[str, np.ndarray]:
    """The arrays of an .npz (its bytes), by name. BadNpz saying why not, before anything
    is unpacked, where a member is not a plain numeric .npy whose header agrees with its
    size or where they unpack to more than `limit` bytes; BadNpz as well for anything the
    unpacking raises (a corrupt zip, a corrupt deflate stream, an unknown compression, an
    encrypted member). Nothing is unpickled."""
    try:
        with zipfile.ZipFile(io.BytesIO(payload)) as archive:
            total = sum(_check_npz_member(archive, info, len(payload)) for info in archive.infolist())
        if total > limit:
            raise ValueError(f"its arrays unpack to {total:,} bytes, more than the {limit:,} allowed")
        with np.load(io.BytesIO(payload), allow_pickle=False) as npz:
            return {name: npz[name] for name in npz.files}
    except Exception as exc:  # untrusted bytes: zipfile, zlib, bz2, lzma and numpy each raise their own
        raise BadNpz(" ".join(f"{type(exc).__name__}: {exc}".split())[:300]) from None
