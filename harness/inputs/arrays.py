"""A user's own arrays (data kind `arrays`, harness.check_port's `data` given as NumPy arrays):
an .npz file of the data folder, checked against the spec's sha256 and read without
unpickling anything; each split's features and labels checked (check_split)."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import numpy as np

from harness.core.errors import DataError
from harness.inputs.data import DATA_DIR_ENV, IdxSplit, UsedFile, checked_bytes
from harness.spec.data import ArraysData

# The largest .npz file of a user's arrays read, and the most its arrays may unpack to.
ARRAYS_MAX_BYTES = 2 * 2**30

ARRAY_NAMES = ("x_train", "y_train", "x_val", "y_val")


def load_arrays(section: ArraysData, data_dir: Path, max_bytes: int = ARRAYS_MAX_BYTES) -> IdxSplit:
    """A user's arrays from an .npz file of the data folder, checked against the spec's
    sha256; nothing in it unpickled (allow_pickle=False), its unpacked size bounded before it
    is read. Features float32, finite; labels integers from 0, or float32 targets."""
    path = data_dir / section.file
    if not path.is_file():
        raise DataError(f"data.file: {path}: missing. Put the file there, or point --data-dir or ${DATA_DIR_ENV} at a folder that has it")
    raw, got = checked_bytes(path, max_bytes, "arrays file", section.sha256)
    try:
        with zipfile.ZipFile(io.BytesIO(raw)) as archive:
            members = {info.filename.removesuffix(".npy"): info.file_size for info in archive.infolist()}
        if sum(members.values()) > max_bytes:
            raise DataError(f"data.file: {path} unpacks to more than {max_bytes / 2**30:g} GiB")
        with np.load(io.BytesIO(raw), allow_pickle=False) as found:
            arrays = {name: found[name] for name in ARRAY_NAMES if name in members}
    except (zipfile.BadZipFile, ValueError, OSError) as exc:
        raise DataError(f"data.file: {path} is not a NumPy .npz file of plain arrays ({' '.join(str(exc).split())[:200]})") from None
    unknown = sorted(set(members) - set(ARRAY_NAMES))
    if unknown or "x_train" not in arrays or "y_train" not in arrays or (("x_val" in arrays) != ("y_val" in arrays)):
        raise DataError(
            f"data.file: {path} holds {', '.join(sorted(members))}: it must hold x_train and y_train, and x_val and y_val both or neither"
        )
    for part in ("train", "val"):
        if f"x_{part}" in arrays:
            where, x, y = f"data.file: {path}: x_{part} and y_{part}", arrays[f"x_{part}"], arrays[f"y_{part}"]
            if section.tokens is None:
                check_split(where, x, y)
            else:
                check_tokens(where, x, y, section.tokens.context, section.tokens.vocabulary)
                arrays[f"x_{part}"] = x.astype(np.int64)
    x, y = arrays["x_train"], arrays["y_train"]
    if "x_val" in arrays and (
        arrays["x_val"].shape[1:] != x.shape[1:] or arrays["y_val"].shape[1:] != y.shape[1:] or arrays["y_val"].dtype.kind != y.dtype.kind
    ):
        raise DataError(f"data.file: {path}: x_val and y_val must be shaped as x_train and y_train are, but for their rows")
    y_val = arrays.get("y_val")
    if y.dtype.kind in "iu":
        y, y_val = y.astype(np.int64), None if y_val is None else y_val.astype(np.int64)
    return IdxSplit(x, y, arrays.get("x_val"), y_val, (UsedFile(name=section.file, path=str(path), sha256=got),), x.shape[1:])


def check_tokens(where: str, x: np.ndarray, y: np.ndarray, context: int, vocabulary: int, error: type[Exception] = DataError) -> None:
    """One split of token ids (data kind arrays with tokens): x and y integers of (n, context)
    each, y each position's next token, every id from 0 to below `vocabulary`."""
    for name, a in (("x", x), ("y", y)):
        if a.dtype.kind not in "iu" or a.ndim != 2 or a.shape != (len(x), context) or len(a) == 0:
            raise error(f"{where}: token ids are integers of (examples, context {context}) for x and y alike: {name} is {a.dtype} of {a.shape}")
        if a.min(initial=0) < 0 or a.max(initial=0) >= vocabulary:
            raise error(f"{where}: {name}'s token ids go from {a.min()} to {a.max()}, outside 0 to {vocabulary - 1} (the vocabulary)")


def check_split(where: str, x: np.ndarray, y: np.ndarray, error: type[Exception] = DataError) -> None:
    """One split's features and labels (a user's arrays: data kind arrays, harness.check_port's
    `data`): float32 features of one vector or image a row, finite, as many rows as labels;
    labels integers from 0, one a row, or finite float32 targets. `error` naming `where`."""
    if x.dtype.kind in "iu":
        raise error(f"{where}: integer features: features are float32 vectors or images (token ids: data.tokens, x and y of (examples, context))")
    if x.dtype != np.float32:
        raise error(f"{where}: features are float32, got {x.dtype} (x.astype(numpy.float32))")
    if x.ndim not in (2, 4) or len(x) == 0:
        raise error(f"{where}: x has shape {x.shape}: one vector (n, features) or image (n, channels, height, width) a row")
    if not np.isfinite(x).all():
        raise error(f"{where}: x holds NaN or infinite values")
    if y.dtype.kind in "iu":
        if y.ndim != 1 or y.min(initial=0) < 0:
            raise error(f"{where}: labels are class indices 0, 1, ..., one a row: y has shape {y.shape}, down to {y.min(initial=0)}")
    elif y.dtype != np.float32 or y.ndim not in (1, 2) or not np.isfinite(y).all():
        raise error(f"{where}: y is {y.dtype} of shape {y.shape}: integer labels, or finite float32 targets (n,) or (n, outputs)")
    if len(y) != len(x):
        raise error(f"{where}: x has {len(x)} rows, y {len(y)}")
