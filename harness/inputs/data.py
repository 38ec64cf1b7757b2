"""Framework-neutral data: the peaks grid, make_moons reproduced, and IDX files (MNIST).

Everything is NumPy. Arrays handed to adapters are float32 features and either float32
regression targets (n, 1) or int64 class indices (n,).
"""

from __future__ import annotations

import gzip
import hashlib
import math
import os
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from harness.core.errors import DataError
from harness.core.files import DEFLATE_MAX_RATIO, open_regular, read_regular
from harness.spec.data import IdxData, IdxFile, PeaksData, TextData

DATA_DIR_ENV = "HARNESS_DATA_DIR"
# Fixed in code, never taken from a spec: a spec names files, not addresses.
MNIST_MIRRORS = (
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "https://storage.googleapis.com/cvdf-datasets/mnist/",
)
IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
IDX_MAX_DIMS = 8
IDX_MAX_BYTES = 2 * 2**30  # an IDX file's data, decompressed: MNIST's largest is 47 MB
IDX_CHUNK = 1 << 20
# The images become float32 features (4 bytes a pixel), then the training and validation
# rows are copied out of them: twice that, at once. The limit is resources' (8 GiB unless
# --max-memory-gb says otherwise): a 2 GiB file of bytes made 8 GiB of features, and more.
FEATURE_COPIES = 2
DEFAULT_FEATURES_MAX_BYTES = 8 * 2**30
# The largest text file read (its examples are int64 token ids, 16 bytes a byte of text,
# inputs and targets): GPL-3 is 35 kB.
TEXT_MAX_BYTES = 64 * 2**20


# --- peaks ------------------------------------------------------------------------------


def peaks(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """MATLAB's peaks surface."""
    return (
        3 * (1 - x) ** 2 * np.exp(-(x**2) - (y + 1) ** 2)
        - 10 * (x / 5 - x**3 - y**5) * np.exp(-(x**2) - y**2)
        - 1 / 3 * np.exp(-((x + 1) ** 2) - y**2)
    )


def peaks_grid(section: PeaksData) -> tuple[np.ndarray, np.ndarray]:
    """The grid as the Flux article builds it: x1 varies fastest (repeat outer), x2 slowest
    (repeat inner); float32 inputs, the target computed in float64 and rounded to float32."""
    axis = np.linspace(section.low, section.high, section.points_per_axis, dtype=np.float32)
    n = section.points_per_axis
    x1 = np.tile(axis, n)  # outer repetition
    x2 = np.repeat(axis, n)  # inner repetition
    features = np.stack([x1, x2], axis=1)
    target = peaks(x1.astype(np.float64), x2.astype(np.float64)).astype(np.float32)
    return features, target.reshape(-1, 1)


# --- moons ------------------------------------------------------------------------------


def make_moons(n_samples: int, noise: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's make_moons(n_samples, shuffle=True, noise) after np.random.seed(seed).

    The same algorithm and the same draws from a legacy RandomState: two half circles,
    shuffled with a permutation, then Gaussian noise added. Returns float32 points and
    int64 labels, as the article casts everything to float32.
    """
    rng = np.random.RandomState(seed)
    n_out = n_samples // 2
    n_in = n_samples - n_out
    outer = np.linspace(0, np.pi, n_out)
    inner = np.linspace(0, np.pi, n_in)
    x = np.append(np.cos(outer), 1 - np.cos(inner))
    y = np.append(np.sin(outer), 1 - np.sin(inner) - 0.5)
    points = np.vstack([x, y]).T
    labels = np.hstack([np.zeros(n_out, dtype=np.intp), np.ones(n_in, dtype=np.intp)])
    order = np.arange(n_samples)
    rng.shuffle(order)  # sklearn.utils.shuffle -> resample(replace=False)
    points, labels = points[order], labels[order]
    if noise:
        points = points + rng.normal(scale=noise, size=points.shape)
    return points.astype(np.float32), labels.astype(np.int64)


def image_patterns(section) -> tuple[np.ndarray, np.ndarray]:
    """Small seeded images for the generated family: each class a random smooth pattern
    (a sum of a few oriented waves per channel), each example its class's pattern under
    Gaussian noise, flattened in (channels, height, width) order. float32 images, int64 labels."""
    rng = np.random.default_rng(section.seed)
    c, h, w = section.shape
    rows, cols = np.meshgrid(np.linspace(0, 1, h), np.linspace(0, 1, w), indexing="ij")
    templates = np.zeros((section.classes, c, h, w))
    for k in range(section.classes):
        for ch in range(c):
            for _ in range(3):
                fy, fx, phase = rng.uniform(0.5, 3.0), rng.uniform(0.5, 3.0), rng.uniform(0, 2 * np.pi)
                templates[k, ch] += np.sin(2 * np.pi * (fy * rows + fx * cols) + phase)
    labels = rng.integers(0, section.classes, size=section.n_samples)
    images = templates[labels] + rng.normal(scale=section.noise, size=(section.n_samples, c, h, w))
    return images.reshape(section.n_samples, -1).astype(np.float32), labels.astype(np.int64)


# --- IDX files --------------------------------------------------------------------------


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    f, _ = open_regular(path, "data file", error=DataError)
    with f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _read_at_most(stream: BinaryIO, count: int) -> bytearray:
    """Up to `count` bytes of `stream` (fewer where it ends), read a chunk at a time: a
    gzip stream is decompressed only as far as it is read."""
    got = bytearray()
    while len(got) < count:
        chunk = stream.read(min(count - len(got), IDX_CHUNK))
        if not chunk:
            break
        got += chunk
    return got


def _header(path: Path, stream: BinaryIO) -> tuple[np.dtype, tuple[int, ...]]:
    """An IDX file's element type and dimensions, from its header."""
    magic = _read_at_most(stream, 4)
    if len(magic) < 4 or magic[0] != 0 or magic[1] != 0 or magic[2] not in IDX_DTYPES or magic[3] == 0:
        raise DataError(f"{path}: not an IDX file (wrong magic number {magic.hex() or 'none'})")
    dtype, ndim = np.dtype(IDX_DTYPES[magic[2]]), magic[3]
    if ndim > IDX_MAX_DIMS:
        raise DataError(f"{path}: an IDX header of {ndim} dimensions (at most {IDX_MAX_DIMS})")
    dims = _read_at_most(stream, 4 * ndim)
    if len(dims) < 4 * ndim:
        raise DataError(f"{path}: truncated IDX header")
    return dtype, struct.unpack(f">{ndim}I", dims)


def _parse_idx(path: Path, stream: BinaryIO, max_bytes: int, file_size: int, compressed: bool) -> np.ndarray:
    dtype, shape = _header(path, stream)
    ndim = len(shape)
    # The data's size, from the header alone, checked before anything is allocated: against
    # the limit, and against what the file can hold (a raw file holds exactly its size less
    # the header; a gzip stream at most DEFLATE_MAX_RATIO times its compressed size).
    expected = math.prod(shape) * dtype.itemsize  # Python ints: no overflow
    if expected > max_bytes:
        raise DataError(f"{path}: the IDX header's dimensions {shape} make {expected:,} bytes, more than the {max_bytes:,} allowed")
    if compressed and expected > DEFLATE_MAX_RATIO * file_size:
        raise DataError(f"{path}: the IDX header's dimensions {shape} make {expected:,} bytes, more than a gzip file of {file_size:,} bytes can hold")
    if not compressed and file_size - 4 - 4 * ndim != expected:
        held = file_size - 4 - 4 * ndim
        found = f"more than {expected}" if held > expected else str(held)
        raise DataError(f"{path}: truncated or oversized IDX data: {found} bytes, the header says {expected}")
    body = np.empty(expected, dtype=np.uint8)  # not touched: memory is taken as it is filled
    view, got = memoryview(body), 0
    while got < expected:
        n = stream.readinto(view[got : got + IDX_CHUNK])
        if not n:
            break
        got += n
    if got == expected and stream.read(1):  # one byte more tells an oversized file
        got += 1
    if got != expected:
        found = f"more than {expected}" if got > expected else str(got)
        raise DataError(f"{path}: truncated or oversized IDX data: {found} bytes, the header says {expected}")
    return body.view(dtype).reshape(shape)


def idx_shape(path: Path) -> tuple[int, ...]:
    """The dimensions an IDX file's header declares (gzip-compressed or raw), read without
    its data: what `harness validate` checks a spec's input against."""
    path = Path(path)
    f, _ = open_regular(path, "data file", error=DataError)
    try:
        with f:
            if f.read(2) != b"\x1f\x8b":
                f.seek(0)
                return _header(path, f)[1]
            f.seek(0)
            try:
                with gzip.GzipFile(fileobj=f, mode="rb") as stream:
                    return _header(path, stream)[1]
            except (OSError, EOFError, zlib.error) as exc:
                raise DataError(f"{path}: corrupt or truncated gzip data: {exc}") from None
    except OSError as exc:
        raise DataError(f"{path}: cannot read: {exc.strerror or exc}") from None


def read_idx(path: Path, max_bytes: int = IDX_MAX_BYTES) -> np.ndarray:
    """Read an IDX file (gzip-compressed or raw, a regular file) into a NumPy array of its
    declared shape. The header's size is checked against `max_bytes` and against the
    file's size before the data is allocated or read, and a gzip stream is decompressed no
    further than the header's size (plus one byte)."""
    path = Path(path)
    f, file_size = open_regular(path, "data file", error=DataError)
    try:
        with f:
            compressed = f.read(2) == b"\x1f\x8b"
            f.seek(0)
            if not compressed:
                return _parse_idx(path, f, max_bytes, file_size, compressed=False)
            try:
                with gzip.GzipFile(fileobj=f, mode="rb") as stream:
                    return _parse_idx(path, stream, max_bytes, file_size, compressed=True)
            except (OSError, EOFError, zlib.error) as exc:
                raise DataError(f"{path}: corrupt or truncated gzip data: {exc}") from None
    except OSError as exc:
        raise DataError(f"{path}: cannot read: {exc.strerror or exc}") from None


# The real MNIST test-set files shipped with the harness (harness/data/mnist/README.md: their
# attribution and licence), by name with their sha256: the offline default of a spec whose
# training files are not found (harness/inputs/problem.py).
EMBEDDED_DIR = Path(__file__).resolve().parents[1] / "data" / "mnist"
EMBEDDED = {
    "t10k-images-idx3-ubyte.gz": "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
    "t10k-labels-idx1-ubyte.gz": "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
}


def source_present(section: IdxData, source: str, data_dir: Path) -> bool:
    """Whether every file of a source is in data_dir (gzip or raw), unchecked."""
    files = (section.sources[source].images, section.sources[source].labels)
    return all((data_dir / f.file).is_file() or (data_dir / f.file.removesuffix(".gz")).is_file() for f in files)


def embedded_source(section: IdxData) -> str | None:
    """The spec's data source whose files the harness ships (EMBEDDED: the same names and
    sha256), if it has one."""
    for name, source in section.sources.items():
        if all(EMBEDDED.get(f.file) == f.sha256 for f in (source.images, source.labels)):
            return name
    return None


def default_data_dir() -> Path:
    env = os.environ.get(DATA_DIR_ENV)
    if env:
        return Path(env)
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "repro-harness" / "data"


def _download(name: str, sha256: str, dest: Path, mirrors: tuple[str, ...] = MNIST_MIRRORS) -> Path:
    """Fetch `name` from the fixed mirrors into dest with pooch, which keeps it only if its
    sha256 matches (a mismatch leaves nothing behind)."""
    import pooch  # imported here: only a download needs it

    if name in _FAILED:  # tried once per file in a run, not once per spec that names it
        raise _FAILED[name]
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # HOME=/dev/null, a read-only cache: say where, in one line
        raise DataError(f"{dest}: cannot make the data folder for --download: {exc.strerror or exc} (set --data-dir or ${DATA_DIR_ENV})") from None
    reasons = []
    for mirror in mirrors:
        try:
            got = pooch.retrieve(mirror + name, known_hash=f"sha256:{sha256}", fname=name, path=dest, progressbar=False)
        except (ValueError, OSError) as exc:  # a hash mismatch; HTTP and network errors (requests' are OSErrors)
            reasons.append(f"{mirror}: {_reason(exc)}")
            continue
        return Path(got)
    failed = DataError(
        f"{dest / name}: cannot download it ({'; '.join(reasons)}). Put the file there, point --data-dir or ${DATA_DIR_ENV} at a "
        "folder that has it, or run --download where the mirrors can be reached"
    )
    _FAILED[name] = failed
    raise failed


# The downloads that failed in this process, by file name: each is tried once (issue 55).
_FAILED: dict[str, DataError] = {}

# A download's failure in a few words, from the words of the libraries' messages (urllib3's
# run to 800 characters: the mirror's name did not resolve, under three layers of retries).
_REASONS = (
    (("Name or service not known", "Temporary failure in name resolution", "nodename nor servname"), "no network: the name did not resolve"),
    (("Connection refused",), "connection refused"),
    (("timed out", "Timeout"), "timed out"),
    (("hash", "Hash"), "its sha256 is not the spec's"),
)


def _reason(exc: BaseException) -> str:
    text = str(exc)
    for words, reason in _REASONS:
        if any(w in text for w in words):
            return reason
    status = getattr(getattr(exc, "response", None), "status_code", None)
    return f"HTTP {status}" if status else f"{type(exc).__name__}: {' '.join(text.split())[:80]}"


def locate(file: IdxFile, data_dir: Path, download: bool, hint: str = "") -> tuple[Path, str]:
    """Find a data file in data_dir, gzip or raw, and verify its sha256; or download it
    (pooch keeps it only if its sha256 matches). The file, and its verified sha256. `hint`
    ends the missing-file error (another data source the spec offers, say)."""
    raw_name = file.file.removesuffix(".gz")
    candidates = [(data_dir / file.file, file.sha256)]
    if raw_name != file.file:
        candidates.append((data_dir / raw_name, file.raw_sha256))
    for candidate, expected in candidates:
        if not candidate.is_file():
            continue
        if expected is None:
            raise DataError(f"{candidate}: the spec gives no raw_sha256 to check this uncompressed file against")
        got = sha256_of(candidate)
        if got != expected:
            raise DataError(f"{candidate}: checksum mismatch: sha256 is {got}, the spec says {expected}")
        return candidate, got
    if download:
        return _download(file.file, file.sha256, data_dir), file.sha256
    raise DataError(
        f"{data_dir / file.file}: missing. Put the file there, point --data-dir or ${DATA_DIR_ENV} at a folder that has it, or pass --download{hint}"
    )


@dataclass(frozen=True)
class UsedFile:
    name: str
    path: str
    sha256: str


@dataclass(frozen=True)
class IdxSplit:
    x_train: np.ndarray
    y_train: np.ndarray
    x_val: np.ndarray
    y_val: np.ndarray
    files: tuple[UsedFile, ...]
    example_shape: tuple[int, ...] = ()  # one image's (height, width), as its file gives it; () for a text


def load_idx(
    section: IdxData,
    source: str,
    data_dir: Path,
    download: bool = False,
    max_bytes: int = DEFAULT_FEATURES_MAX_BYTES,
    admit: Callable[[int], None] | None = None,
) -> IdxSplit:
    """Read a source's image and label files, scale and flatten the images, and split them
    at random (seeded) into train and validation. Before the features are made, `admit`
    is given the number of training examples (the run's resource check), and the images
    are refused where their features would take more than `max_bytes` (FEATURE_COPIES
    float32 copies: images wider than the model's input are seen here first)."""
    if source not in section.sources:
        raise DataError(f"data.sources: no source {source!r} (known: {', '.join(sorted(section.sources))})")
    chosen = section.sources[source]
    used = []
    arrays = []
    others = sorted(set(section.sources) - {source})
    hint = f"; or choose another of the spec's data sources: {', '.join(f'--data-source {o}' for o in others)}" if others else ""
    for file in (chosen.images, chosen.labels):
        path, sha256 = locate(file, data_dir, download, hint)
        arrays.append(read_idx(path))
        used.append(UsedFile(name=file.file, path=str(path), sha256=sha256))
    images, labels = arrays
    if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
        raise DataError(f"{used[0].path}: images {images.shape} and labels {labels.shape} do not make an image data set")
    if labels.dtype.kind not in "iu" or labels.min(initial=0) < 0:
        raise DataError(f"{used[1].path}: labels must be class indices 0, 1, ...: found {labels.dtype} down to {labels.min(initial=0)}")
    if images.dtype.kind == "f" and not np.isfinite(images).all():
        raise DataError(f"{used[0].path}: images hold NaN or infinite values")
    if chosen.validation >= len(images):
        raise DataError(f"data.sources.{source}.validation: {chosen.validation} leaves no training examples of {len(images)}")
    if admit is not None:
        admit(len(images) - chosen.validation)
    need = FEATURE_COPIES * images.size * np.dtype(np.float32).itemsize
    if need > max_bytes:
        raise DataError(
            f"{used[0].path}: {len(images):,} images of {images[0].size:,} pixels make {need / 2**30:,.1f} GiB of float32 features, "
            f"more than the {max_bytes / 2**30:g} GiB allowed (--max-memory-gb raises it)"
        )
    features = images.reshape(len(images), -1).astype(np.float32)
    features /= np.float32(section.scale)  # in place: the same float32 quotients as features / scale
    order = np.random.default_rng(section.split_seed).permutation(len(images))
    val, train = order[: chosen.validation], order[chosen.validation :]
    targets = labels.astype(np.int64)
    return IdxSplit(features[train], targets[train], features[val], targets[val], tuple(used), images.shape[1:])


# --- text -------------------------------------------------------------------------------


# Where a text not in the data folder is looked for next: the licences Debian's base-files
# ships on every Debian and Ubuntu host (real English prose, GPL-3 the longest).
SYSTEM_TEXTS = Path("/usr/share/common-licenses")


def checked_bytes(path: Path, max_bytes: int, what: str, sha256: str) -> tuple[bytes, str]:
    """A data file's bytes and their sha256, which must be the spec's (data.sha256): a folder,
    a FIFO, a file past the limit said by the reader, named by the key here."""
    try:
        raw = read_regular(path, max_bytes, what, error=DataError)
    except DataError as exc:
        raise DataError(f"data.file: {exc}") from None
    got = hashlib.sha256(raw).hexdigest()
    if got != sha256:
        raise DataError(f"data.sha256: checksum mismatch: {path} has sha256 {got}, the spec says {sha256}")
    return raw, got


def load_text(section: TextData, data_dir: Path) -> IdxSplit:
    """A text file of the data folder (or of SYSTEM_TEXTS), checked against the spec's sha256, as examples of
    `context` byte tokens: example i is the bytes [i * context, (i + 1) * context), its
    targets the bytes one further on (each position's next byte), the examples not
    overlapping, the text's last bytes that fill no example left out. `validation`
    examples are held out, drawn with split_seed. int64 token ids and targets, (n, context)."""
    path = data_dir / section.file
    if not path.exists() and (SYSTEM_TEXTS / section.file).is_file():
        path = SYSTEM_TEXTS / section.file  # a text the system ships; its sha256 is checked all the same
    if not path.exists():
        where = f"data.file: {data_dir / section.file}: missing (and not in {SYSTEM_TEXTS})"
        raise DataError(f"{where}. Put the file there, or point --data-dir or ${DATA_DIR_ENV} at a folder that has it")
    raw, got = checked_bytes(path, TEXT_MAX_BYTES, "text data file", section.sha256)
    nul = raw.find(b"\0")
    if nul >= 0:  # git's test of a binary file: a text of bytes holds no NUL
        raise DataError(f"data.file: {path} is not a text: its byte {nul:,} is NUL (a binary file?)")
    tokens = np.frombuffer(raw, dtype=np.uint8)
    n = max(len(tokens) - 1, 0) // section.context
    if n == 0:
        raise DataError(
            f"data.context: {section.context} tokens an example, but {path} has {len(tokens):,} bytes: "
            f"no example (one takes context + 1 bytes, its targets one further on)"
        )
    if section.validation >= n:
        raise DataError(
            f"data.validation: {section.validation} leaves no training examples of the {n} examples of {section.context} tokens in {path}"
        )
    windows = tokens[np.arange(n)[:, None] * section.context + np.arange(section.context + 1)].astype(np.int64)
    x, y = windows[:, :-1], windows[:, 1:]
    order = np.random.default_rng(section.split_seed).permutation(n)
    val, train = order[: section.validation], order[section.validation :]
    return IdxSplit(x[train], y[train], x[val], y[val], (UsedFile(name=section.file, path=str(path), sha256=got),))
