"""The framework-neutral data: the peaks grid, make_moons against scikit-learn, the IDX reader."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest

from harness.core.errors import DataError
from harness.core.paths import SPECS_DIR
from harness.inputs import data
from harness.spec.data import PeaksData
from harness.spec.load import load_spec


def test_peaks_grid_matches_the_article():
    x, y = data.peaks_grid(PeaksData(kind="peaks_grid", points_per_axis=200, low=-3, high=3))
    assert x.shape == (40000, 2) and y.shape == (40000, 1) and x.dtype == y.dtype == np.float32
    axis = np.linspace(-3, 3, 200, dtype=np.float32)
    assert np.array_equal(x[:200, 0], axis) and np.all(x[:200, 1] == -3)  # x1 fastest (outer repeat)
    assert np.array_equal(x[::200, 1], axis) and np.all(x[::200, 0] == -3)  # x2 slowest (inner repeat)
    # Values of MATLAB's peaks(x, y), written out by hand.
    assert data.peaks(np.array(0.0), np.array(0.0)) == pytest.approx(3 * np.exp(-1) - np.exp(-1) / 3)
    assert data.peaks(np.array(1.0), np.array(-1.0)) == pytest.approx(-10 * (0.2 - 1 + 1) * np.exp(-2) - np.exp(-5) / 3)
    assert float(y.max()) == pytest.approx(8.1, abs=0.05) and float(y.min()) == pytest.approx(-6.5, abs=0.05)


@pytest.mark.parametrize("n, noise, seed", [(5000, 0.2, 0), (101, 0.05, 3), (10, 0.0, 7)])
def test_make_moons_reproduces_scikit_learn(n, noise, seed):
    datasets = pytest.importorskip("sklearn.datasets")
    np.random.seed(seed)  # the article's global seed
    expected_x, expected_y = datasets.make_moons(n, noise=noise or None)
    x, y = data.make_moons(n, noise, seed)
    assert np.array_equal(y, expected_y)
    assert np.array_equal(x, expected_x.astype(np.float32))


def idx_bytes(array: np.ndarray, code: int) -> bytes:
    header = bytes([0, 0, code, array.ndim]) + b"".join(struct.pack(">I", d) for d in array.shape)
    return header + array.astype(array.dtype.newbyteorder(">")).tobytes()


@pytest.mark.parametrize("compress", [False, True])
def test_idx_reader_on_synthetic_files(tmp_path, compress):
    images = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    floats = np.linspace(-1, 1, 6).reshape(3, 2)
    for name, array, code in [("u8", images, 0x08), ("f8", floats, 0x0E)]:
        payload = idx_bytes(array, code)
        path = tmp_path / name
        path.write_bytes(gzip.compress(payload) if compress else payload)
        got = data.read_idx(path)
        assert got.shape == array.shape and np.array_equal(got, array)


@pytest.mark.parametrize(
    "payload, message",
    [
        (b"\x00\x00\x08", "wrong magic"),
        (b"\x12\x34\x08\x01" + struct.pack(">I", 3) + b"abc", "wrong magic"),
        (b"\x00\x00\x08\x02" + struct.pack(">I", 3), "truncated IDX header"),
        (b"\x00\x00\x08\x01" + struct.pack(">I", 10) + b"abc", "truncated or oversized"),
        (gzip.compress(b"\x00\x00\x08\x01" + struct.pack(">I", 3) + b"abc", mtime=0)[:-6], "corrupt or truncated gzip"),
    ],
)
def test_idx_reader_rejects_bad_files(tmp_path, payload, message):
    path = tmp_path / "bad-idx"
    path.write_bytes(payload)
    with pytest.raises(DataError, match=message) as info:
        data.read_idx(path)
    assert str(path) in str(info.value)


def test_real_mnist_test_set(mnist_dir):
    images = data.read_idx(mnist_dir / "t10k-images-idx3-ubyte.gz")
    labels = data.read_idx(mnist_dir / "t10k-labels-idx1-ubyte.gz")
    assert images.shape == (10000, 28, 28) and images.dtype == np.uint8 and images.max() == 255
    assert labels.shape == (10000,) and set(np.unique(labels)) == set(range(10))
    assert np.bincount(labels).tolist()[:3] == [980, 1135, 1032]  # the test set's well-known class counts


def test_a_fresh_clone_without_a_data_folder_tests_on_the_shipped_mnist_files(monkeypatch, tmp_path):
    """No $HARNESS_DATA_DIR and no folder beside the checkout: the real-data tests run on the
    test-set files the harness ships, not skipped."""
    import tests.conftest as conftest

    monkeypatch.delenv(data.DATA_DIR_ENV, raising=False)
    monkeypatch.setattr(conftest, "SHARED_MNIST", tmp_path / "absent")
    assert conftest.offline_mnist_dir() == data.EMBEDDED_DIR


def test_mnist_split_and_recorded_files(mnist_dir):
    section = load_spec(SPECS_DIR / "mnist_mlp.yaml").spec.data
    split = data.load_idx(section, "test-set", mnist_dir)
    assert split.x_train.shape == (8000, 784) and split.x_val.shape == (2000, 784)
    assert split.x_train.dtype == np.float32 and 0 <= split.x_train.min() and split.x_train.max() == 1
    assert [f.sha256 for f in split.files] == [section.sources["test-set"].images.sha256, section.sources["test-set"].labels.sha256]
    again = data.load_idx(section, "test-set", mnist_dir)
    assert np.array_equal(split.y_val, again.y_val)


def test_raw_idx_copy_is_checked_against_raw_sha256(tmp_path, mnist_dir):
    section = load_spec(SPECS_DIR / "mnist_mlp.yaml").spec.data
    for name in ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"):
        (tmp_path / name).write_bytes(gzip.decompress((mnist_dir / f"{name}.gz").read_bytes()))
    split = data.load_idx(section, "test-set", tmp_path)
    assert len(split.x_train) == 8000 and split.files[0].name == "t10k-images-idx3-ubyte.gz"
    raw = tmp_path / "t10k-labels-idx1-ubyte"
    raw.write_bytes(raw.read_bytes()[:-1] + b"\x00")
    with pytest.raises(DataError, match="checksum mismatch"):
        data.load_idx(section, "test-set", tmp_path)


def test_missing_and_tampered_files_are_clear_errors(tmp_path, mnist_dir):
    section = load_spec(SPECS_DIR / "mnist_mlp.yaml").spec.data
    with pytest.raises(DataError, match=r"t10k-images-idx3-ubyte.gz: missing.*--data-dir"):
        data.load_idx(section, "test-set", tmp_path)
    tampered = tmp_path / "t10k-images-idx3-ubyte.gz"
    tampered.write_bytes((mnist_dir / tampered.name).read_bytes()[:-10])
    with pytest.raises(DataError, match="checksum mismatch"):
        data.load_idx(section, "test-set", tmp_path)


@pytest.fixture
def mirror(tmp_path):
    """A local HTTP mirror serving tmp_path/served (the download path, without the network)."""
    import functools
    import http.server
    import threading

    served = tmp_path / "served"
    served.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield served, f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()


def test_a_download_is_kept_only_when_its_sha256_matches(tmp_path, mirror):
    import hashlib

    served, url = mirror
    payload = b"IDX bytes, say"
    (served / "file.gz").write_bytes(payload)
    good = hashlib.sha256(payload).hexdigest()
    dest = tmp_path / "data"
    got = data._download("file.gz", good, dest, mirrors=("http://127.0.0.1:9/", url))  # the first mirror is down
    assert got == dest / "file.gz" and got.read_bytes() == payload
    other = tmp_path / "other"
    with pytest.raises(DataError) as raised:
        data._download("other.gz", "0" * 64, other, mirrors=("http://127.0.0.1:9/", url))
    (served / "other.gz").write_bytes(payload)
    assert str(raised.value) == (
        f"{other / 'other.gz'}: cannot download it (http://127.0.0.1:9/: connection refused; {url}: HTTP 404). Put the file there, "
        "point --data-dir or $HARNESS_DATA_DIR at a folder that has it, or run --download where the mirrors can be reached"
    )
    with pytest.raises(DataError, match=r"cannot download it \(http://127\.0\.0\.1:9/: connection refused; .*: its sha256 is not the spec's\)"):
        data._download("file.gz", "0" * 64, other, mirrors=("http://127.0.0.1:9/", url))
    assert not any(other.iterdir())  # nothing half-written or unchecked is left
    with pytest.raises(DataError) as again:  # tried once a run: now it is there, but the failure stands
        data._download("other.gz", "0" * 64, other, mirrors=(url,))
    assert again.value is raised.value


def test_without_its_training_files_an_mnist_spec_runs_on_the_shipped_test_set(tmp_path, monkeypatch):
    """Issue 55: on a fresh clone with no data folder and no network, an MNIST spec whose
    training files are not found runs on the real test-set files shipped in
    harness/data/mnist (their sha256 the spec's), and the problem says which source it used;
    asked for by name (--data-source), the missing source stays an error."""
    from harness.inputs.problem import build_problem

    loaded = load_spec(SPECS_DIR / "mnist_mlp.yaml", "quick")
    problem = build_problem(loaded, tmp_path)
    assert problem.data_source == "test-set" and problem.x_train.shape[1] == 784
    assert all(Path(f.path).parent == data.EMBEDDED_DIR for f in problem.data_files)
    assert {f.name: f.sha256 for f in problem.data_files} == data.EMBEDDED
    with pytest.raises(DataError, match="train-images-idx3-ubyte.gz: missing"):
        build_problem(loaded, tmp_path, "train-set")
    for name in data.EMBEDDED:  # the shipped copy is checked as any file is: altered, it is refused
        (tmp_path / "shipped").mkdir(exist_ok=True)
        (tmp_path / "shipped" / name).write_bytes((data.EMBEDDED_DIR / name).read_bytes())
    altered = tmp_path / "shipped" / "t10k-labels-idx1-ubyte.gz"
    altered.write_bytes(altered.read_bytes()[:-8])
    monkeypatch.setattr(data, "EMBEDDED_DIR", tmp_path / "shipped")
    with pytest.raises(DataError, match="t10k-labels-idx1-ubyte.gz: checksum mismatch"):
        build_problem(loaded, tmp_path)


def test_the_shipped_files_sums_and_licence_are_beside_them():
    listed = dict(reversed(line.split()) for line in (data.EMBEDDED_DIR / "SHA256SUMS").read_text().splitlines())
    assert listed == data.EMBEDDED
    assert all(data.sha256_of(data.EMBEDDED_DIR / name) == sha for name, sha in data.EMBEDDED.items())
    said = (data.EMBEDDED_DIR / "README.md").read_text()
    assert "CC BY-SA 3.0" in said and "LeCun" in said
