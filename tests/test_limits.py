"""Limits on hostile input: the size of a spec file, the counts a spec gives, an IDX header
that asks for more than its file holds, the moons' noise, files that are not regular files
(a FIFO, a link to /dev/zero) named as a spec, a record, an artifact or a work-folder cell,
a record that names a key twice, and a kept run whose digest matches but whose content
does not decode. Each ends in one line naming the file (and the key), in bounded time and
memory; nothing here trains, and nothing can hang: a reader that could block on a FIFO runs
in a thread that the test unblocks and fails, one that could read /dev/zero runs in a child
with its memory capped."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import math
import os
import re
import resource
import shutil
import struct
import subprocess
import sys
import threading
import time
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import pytest
import yaml
from rich.console import Console

from harness.core.errors import DataError, RecordError, SpecError
from harness.core.paths import SPECS_DIR
from harness.execute import workdir
from harness.inputs import data, resources
from harness.inputs import problem as inputs
from harness.records import store
from harness.spec import fields as model
from harness.spec.load import load_spec, spec_paths, sweep_overrides
from tests.conftest import ROOT
from tests.helpers import a_sample_outcome, harness, one_line_error, tiny_moons, write_spec

BLOCKED_S = 5.0  # a reader still running after this long is blocked on its FIFO


def finishes(fn, *args, fifos: tuple[Path, ...] = ()):
    """fn(*args), run in a thread: its value, or the exception it raised. Where it is still
    running after BLOCKED_S (blocked opening or reading a FIFO), each FIFO is opened for
    writing and closed, which lets the reader go on, and the test fails."""
    box: dict = {}

    def target():
        try:
            box["value"] = fn(*args)
        except BaseException as exc:  # handed to the test
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(BLOCKED_S)
    if thread.is_alive():
        for fifo in fifos:
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass
        thread.join(BLOCKED_S)
        pytest.fail(f"{getattr(fn, '__name__', fn)} blocked on a FIFO for {BLOCKED_S:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def sparse(path: Path, size: int) -> Path:
    """A file of `size` bytes (NULs) that takes no disk."""
    with open(path, "wb") as f:
        f.truncate(size)
    return path


def committed_record() -> Path:
    """A committed record that has an artifact."""
    return next(p for p in sorted((ROOT / "baselines" / "cpu-quick").rglob("*.json")) if json.loads(p.read_text()).get("artifacts"))


def in_capped_child(code: str, *args: str) -> subprocess.CompletedProcess:
    """`code` run by a child Python with its address space capped at 1 GiB (a reader of
    /dev/zero fails there with MemoryError rather than taking the host's memory)."""

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (2**30, 2**30))

    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, env=env, preexec_fn=cap, capture_output=True, text=True, timeout=60)


# --- 1. the size of a spec file -----------------------------------------------------------


def test_a_spec_file_past_the_size_limit_is_refused_before_it_is_read(tmp_path, capsys):
    spec = sparse(tmp_path / "huge.yaml", 50 * 2**20)
    start = time.perf_counter()
    code, out, err = harness(capsys, "validate", spec)
    assert code == 2 and not out
    one_line_error(err, str(spec), "52,428,800 bytes, more than the 262,144 a spec file may have")
    tracemalloc.start()
    try:
        with pytest.raises(SpecError, match="more than the 262,144"):
            load_spec(spec)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2**20 and time.perf_counter() - start < 5


def test_a_spec_just_under_the_limit_still_loads(tmp_path):
    from harness.spec.load import SPEC_MAX_BYTES

    text = (SPECS_DIR / "moons_net.yaml").read_text()
    padding = "#" * 79 + "\n"
    text += padding * ((SPEC_MAX_BYTES - len(text)) // len(padding))
    spec = tmp_path / "padded.yaml"
    spec.write_text(text)
    assert SPEC_MAX_BYTES - len(padding) < spec.stat().st_size <= SPEC_MAX_BYTES
    assert load_spec(spec).name == "moons_net"


def test_a_spec_that_is_a_fifo_is_refused_at_once(tmp_path):
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    with pytest.raises(SpecError, match=r"fifo\.yaml: a FIFO, not a regular file"):
        finishes(load_spec, fifo, fifos=(fifo,))


# --- 2. the counts a spec gives ------------------------------------------------------------


def hidden_layers(count: int) -> list[dict]:
    return [{"width": 4, "activation": "tanh"} for _ in range(count)] + [{"width": 2, "activation": "identity"}]  # no aliases


@pytest.mark.parametrize(
    "changes, key, limit",
    [
        ({"timing__repeats": 10**9}, "timing.repeats", f"less than or equal to {model.MAX_REPEATS}"),
        ({"logging__print_every": 10**12}, "logging.print_every", f"less than or equal to {model.MAX_STEP}"),
        ({"logging__loss_every": 10**12}, "logging.loss_every", f"less than or equal to {model.MAX_STEP}"),
        ({"checks__probe_size": 10**9}, "checks.probe_size", f"less than or equal to {model.MAX_PROBE}"),
        ({"checks__params_after_steps__step": 10**12}, "checks.params_after_steps.step", f"less than or equal to {model.MAX_STEP}"),
        ({"checks__math_parity": {"steps": 10**12}}, "checks.math_parity.steps", f"less than or equal to {model.MAX_STEP}"),
        ({"checks__loss_curve__must_hold_for": 10**12}, "checks.loss_curve.must_hold_for", f"less than or equal to {model.MAX_STEP}"),
        ({"model__layers": hidden_layers(model.MAX_LAYERS)}, "model.layers", f"at most {model.MAX_LAYERS} items"),
        ({"profiles": {f"p{i}": {} for i in range(model.MAX_PROFILES + 1)}}, "profiles", f"at most {model.MAX_PROFILES} items"),
    ],
    ids=["repeats", "print_every", "loss_every", "probe_size", "step", "math_parity_steps", "must_hold_for", "layers", "profiles"],
)
def test_a_count_past_its_limit_is_refused_naming_its_key(tmp_path, capsys, changes, key, limit):
    spec = tiny_moons(tmp_path, **changes)
    code, out, err = harness(capsys, "validate", spec)
    assert code == 2 and not out
    one_line_error(err, f"{spec}: {key}: ", limit)


def test_a_count_past_its_limit_in_a_profile_names_the_profile(tmp_path, capsys):
    spec = tiny_moons(tmp_path, profiles={"slow": {"timing": {"repeats": 10**9}}})
    code, _, err = harness(capsys, "validate", spec)
    assert code == 2
    one_line_error(err, f"{spec}: profiles.slow.timing.repeats: Input should be less than or equal to {model.MAX_REPEATS}")


def test_a_sweep_of_too_many_points_is_refused(tmp_path, capsys):
    values = list(range(10, 10 + model.MAX_SWEEP_POINTS + 1))
    spec = tiny_moons(tmp_path, profiles={"sweep": {}}, sweep={"key": "data.n_samples", "values": values, "profile": "sweep"})
    code, _, err = harness(capsys, "validate", spec)
    assert code == 2
    one_line_error(err, f"{spec}: sweep.values: List should have at most {model.MAX_SWEEP_POINTS} items")


def test_the_shipped_specs_every_profile_and_sweep_point_are_within_the_limits(capsys):
    code, out, _ = harness(capsys, "validate")
    assert code == 0 and out.count(": ok (") == len(spec_paths()) == 7
    for path in spec_paths().values():
        loaded = load_spec(path)
        for profile in loaded.spec.profiles:
            load_spec(path, profile)
        for extra in sweep_overrides(loaded.spec):
            load_spec(path, loaded.spec.sweep.profile, extra)
        spec = loaded.spec
        assert spec.timing.repeats * 10 <= model.MAX_REPEATS and spec.checks.probe_size * 10 <= model.MAX_PROBE
        assert len(spec.model.layers) * 10 <= model.MAX_LAYERS and len(spec.profiles) * 10 <= model.MAX_PROFILES
        assert max(spec.logging.loss_every, spec.logging.print_every, spec.checks.params_after_steps.step) * 1000 <= model.MAX_STEP
        if spec.data.kind == "moons":
            assert spec.data.noise * 4 <= model.MAX_MOONS_NOISE
        if spec.sweep is not None:
            assert len(spec.sweep.values) * 4 <= model.MAX_SWEEP_POINTS


# --- 3. an IDX header against its file and the memory it makes ------------------------------


def idx_header(code: int, shape: tuple[int, ...]) -> bytes:
    return bytes([0, 0, code, len(shape)]) + struct.pack(f">{len(shape)}I", *shape)


@pytest.mark.parametrize("compressed", [True, False], ids=["gzip", "raw"])
def test_an_idx_header_is_checked_against_the_files_size_before_anything_is_allocated(tmp_path, compressed):
    """A header within the 2 GiB limit (1.5 GB of pixels) on a file of a few hundred bytes."""
    payload = idx_header(0x08, (2_000_000, 28, 28)) + bytes(300)
    path = tmp_path / "images-idx3-ubyte"
    path.write_bytes(gzip.compress(payload) if compressed else payload)
    fragment = "more than a gzip file of" if compressed else "truncated or oversized IDX data: 300 bytes, the header says 1568000000"
    tracemalloc.start()
    try:
        with pytest.raises(DataError, match=re.escape(f"{path}: ") + ".*" + re.escape(fragment)):
            data.read_idx(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2**20


def write_idx_source(folder: Path, images: np.ndarray, labels: np.ndarray, validation: int) -> Path:
    """A spec of the MNIST model whose one data source is these raw (uncompressed) files."""
    source: dict = {"validation": validation}
    for role, array, code in (("images", images, 0x08), ("labels", labels, 0x08)):
        payload = idx_header(code, array.shape) + array.tobytes()
        name = f"bad-{role}-idx-ubyte"
        (folder / name).write_bytes(payload)
        source[role] = {"file": name, "sha256": hashlib.sha256(payload).hexdigest()}
    doc = yaml.safe_load((SPECS_DIR / "mnist_mlp.yaml").read_text())
    return write_spec(folder / "bad.yaml", doc, {"data__sources": {"bad": source}, "data__source": "bad", "profiles": {}})


def test_idx_images_are_measured_before_their_float32_features_are_made(tmp_path):
    """Images far wider than the model's input (the resource estimate counts the model's
    784 inputs): 8 images of a million pixels, 8 MB as bytes, 64 MB as two float32 copies.
    At 2 GiB of bytes the features asked for 8 GiB, twice."""
    images = np.zeros((8, 1000, 1000), dtype=np.uint8)
    spec = write_idx_source(tmp_path, images, np.arange(8, dtype=np.uint8), validation=2)
    loaded = load_spec(spec)
    limits = resources.Limits(memory_gb=0.03)  # 32 MB: the resource check passes, the features do not fit
    tracemalloc.start()
    try:
        with pytest.raises(DataError) as refused:
            inputs.build_problem(loaded, tmp_path, limits=limits)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    message = str(refused.value)
    assert "\n" not in message and message.startswith(str(tmp_path / "bad-images-idx-ubyte"))
    assert "8 images of 1,000,000 pixels make 0.1 GiB of float32 features, more than the 0.03 GiB allowed" in message
    assert peak < images.nbytes + 4 * 2**20  # the bytes were read; no float32 copy was made


def test_the_idx_features_are_the_same_as_before(tmp_path):
    """The features are scaled in place now: the same float32 values as (x / scale)."""
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(12, 28, 28), dtype=np.uint8)
    spec = write_idx_source(tmp_path, images, np.arange(12, dtype=np.uint8) % 10, validation=3)
    section = load_spec(spec).spec.data
    split = data.load_idx(section, "bad", tmp_path)
    expected = (images.reshape(12, -1).astype(np.float32) / np.float32(255.0)).astype(np.float32)
    order = np.random.default_rng(section.split_seed).permutation(12)
    assert np.array_equal(split.x_train, expected[order[3:]]) and np.array_equal(split.x_val, expected[order[:3]])
    assert split.x_train.dtype == np.float32


# --- 4. the moons' noise -------------------------------------------------------------------


@pytest.mark.parametrize("where", ["data", "profile"])
def test_a_moons_noise_of_a_million_is_refused(tmp_path, capsys, where):
    if where == "data":
        spec, key = tiny_moons(tmp_path, data__noise=1e6), "data.noise"
    else:
        spec, key = tiny_moons(tmp_path, profiles={"loud": {"data": {"noise": 1e6}}}), "profiles.loud.data.noise"
    code, out, err = harness(capsys, "validate", spec)
    assert code == 2 and not out
    one_line_error(err, f"{spec}: {key}: Input should be less than or equal to 1")


def test_the_largest_noise_makes_a_small_decision_boundary_mesh():
    """What 1e6 exhausted: the report's figure of the moons meshes the data's range (plus
    half a unit each side) at step 0.01; its points grow with the square of the noise."""
    from harness.report.figures import MESH_STEP

    x, _ = data.make_moons(100_000, model.MAX_MOONS_NOISE, 0)
    points = math.prod(math.ceil((x[:, i].max() - x[:, i].min() + 1) / MESH_STEP) for i in (0, 1))
    assert points < 5_000_000
    x, _ = data.make_moons(5000, 1e6, 0)
    assert math.prod(math.ceil((x[:, i].max() - x[:, i].min() + 1) / MESH_STEP) for i in (0, 1)) > 10**16


# --- 5. only regular files: records, artifacts, work-folder cells ---------------------------


def test_a_record_that_is_a_fifo_is_refused_at_once(tmp_path):
    fifo = tmp_path / "r.json"
    os.mkfifo(fifo)
    with pytest.raises(RecordError, match=r"r\.json: a FIFO, not a regular file; a record is read only from a regular file"):
        finishes(store.read_record, fifo, fifos=(fifo,))
    with pytest.raises(RecordError, match="a FIFO"):
        finishes(store.load_records, tmp_path, fifos=(fifo,))


@pytest.mark.parametrize("reader", ["record", "spec"])
def test_a_link_to_dev_zero_is_refused_without_reading_it(tmp_path, reader):
    """Read in a child whose memory is capped: before the check it read until MemoryError."""
    link = tmp_path / ("r.json" if reader == "record" else "s.yaml")
    link.symlink_to("/dev/zero")
    call = "store.read_record(sys.argv[1])" if reader == "record" else "load_spec(sys.argv[1])"
    code = (
        "import sys\n"
        "from harness.core.errors import HarnessError\n"
        "from harness.records import store\n"
        "from harness.spec.load import load_spec\n"
        f"try:\n    {call}\nexcept HarnessError as exc:\n    print(exc)\n    sys.exit(2)\n"
    )
    done = in_capped_child(code, str(link))
    assert done.returncode == 2, done.stderr[-2000:]
    kind, what = ("a symbolic link", "record") if reader == "record" else ("a character device", "spec file")
    assert done.stdout.strip() == f"{link}: {kind}, not a regular file; a {what} is read only from a regular file"


def test_a_record_past_the_size_limit_is_refused_before_it_is_read(tmp_path):
    path = sparse(tmp_path / "r.json", store.RECORD_MAX_BYTES + 1)
    with pytest.raises(RecordError, match=r"r\.json: 67,108,865 bytes, more than the 67,108,864 a record may have"):
        store.read_record(path)


def results_with_one_record(folder: Path) -> tuple[store.Sources, store.Record, Path]:
    """A results folder holding a committed record (and its artifact): the sources, the
    record and its artifact's path."""
    record_path = committed_record()
    (folder / "spec").mkdir(parents=True)
    shutil.copy(record_path, folder / "spec" / record_path.name)
    sources, records = store.Sources.scan(folder)
    (record,) = records
    artifact = folder / "spec" / record.artifacts.file
    shutil.copy(record_path.with_name(record.artifacts.file), artifact)
    return sources, record, artifact


def test_an_artifact_that_is_a_fifo_is_refused_at_once(tmp_path):
    sources, record, artifact = results_with_one_record(tmp_path)
    assert store.final_params(sources.artifact(record))  # the real one reads
    artifact.unlink()
    os.mkfifo(artifact)
    sources.read.clear()
    with pytest.raises(store.Unavailable, match=f"{artifact.name}: a FIFO, not a regular file"):
        finishes(sources.artifact, record, fifos=(artifact,))


def test_an_artifact_past_the_size_limit_is_refused_before_it_is_read(tmp_path, monkeypatch):
    sources, record, artifact = results_with_one_record(tmp_path)
    monkeypatch.setattr(store, "ARTIFACT_MAX_BYTES", artifact.stat().st_size - 1)
    with pytest.raises(store.Unavailable, match=f"{artifact.name}: {artifact.stat().st_size:,} bytes, more than the"):
        sources.artifact(record)


def kept_cell(folder: Path) -> tuple[Path, workdir.Outcome]:
    outcome = a_sample_outcome()
    cell = folder / "cell.json"
    workdir.save(cell, outcome)
    return cell, outcome


@pytest.mark.parametrize("which", ["json", "npz"])
def test_a_work_folder_cell_that_is_a_fifo_is_not_used_and_nothing_blocks(tmp_path, which):
    cell, outcome = kept_cell(tmp_path)
    path = cell if which == "json" else workdir.npz_path(cell)
    path.unlink()
    os.mkfifo(path)
    with pytest.raises(workdir.Unusable, match="a FIFO, not a regular file"):
        finishes(workdir.load, cell, outcome.key, fifos=(path,))
    console = Console(file=io.StringIO(), width=400)
    assert finishes(workdir.taken, {outcome.key: cell}, console, fifos=(path,)) is None


def test_a_work_folder_cell_that_is_a_link_is_not_used(tmp_path):
    real, outcome = kept_cell(tmp_path / "real")
    cell = tmp_path / "cell.json"
    cell.symlink_to(real)
    shutil.copy(workdir.npz_path(real), workdir.npz_path(cell))
    with pytest.raises(workdir.Unusable, match="a symbolic link, not a regular file"):
        workdir.load(cell, outcome.key)


# --- 6. a record that names a key twice -----------------------------------------------------


@pytest.mark.parametrize(
    "where, key",
    [("{", "framework"), ('"spec": {', "name")],
    ids=["top-level", "nested"],
)
def test_a_record_that_names_a_key_twice_is_refused(tmp_path, where, key):
    text = committed_record().read_text()
    assert store.read_record(committed_record()).framework
    path = tmp_path / "r.json"
    path.write_text(text.replace(where, f'{where}"{key}": "twice", ', 1))
    assert json.loads(path.read_text())  # json alone keeps the last, silently
    with pytest.raises(RecordError) as refused:
        store.read_record(path)
    assert str(refused.value) == f"{path}: not a harness record (schema 1): duplicate key '{key}'"


def test_a_record_is_still_refused_by_its_schema_with_the_key(tmp_path):
    doc = json.loads(committed_record().read_text())
    doc["dtype"] = "float16"
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(RecordError, match=r"r\.json: not a harness record \(schema 1\): dtype: Input should be 'float32' or 'float64'"):
        store.read_record(path)
    path.write_text("{not json")
    with pytest.raises(RecordError, match=r"r\.json: not a harness record \(schema 1\): \(document\): Invalid JSON"):
        store.read_record(path)


# --- 7. a kept run whose digest matches but whose content does not decode -------------------


def npz_of(members: dict[str, bytes], compression: int = zipfile.ZIP_STORED) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=compression) as archive:
        for name, payload in members.items():
            archive.writestr(name, payload)
    return buffer.getvalue()


def npy_header(shape: tuple[int, ...]) -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": "<f4", "fortran_order": False, "shape": shape})
    return buffer.getvalue()


def corrupt_deflate(members: dict[str, bytes]) -> bytes:
    payload = bytearray(npz_of(members, zipfile.ZIP_DEFLATED))
    start = 30 + len(next(iter(members)))  # the first member's data, past its local header
    payload[start] = 0xFF  # a deflate block of the reserved type 3: zlib.error, not a zipfile error
    return bytes(payload)


def rewrite(members: dict[str, bytes], case: str) -> bytes:
    first = next(iter(members))
    if case == "member-not-npy":
        return npz_of({name.removesuffix(".npy"): payload for name, payload in members.items()})
    if case == "header-asks-for-terabytes":
        return npz_of({**members, first: npy_header((10**6, 10**6)) + bytes(64)})
    if case == "truncated-array":
        return npz_of({**members, first: members[first][:-4]})
    if case == "object-array":
        buffer = io.BytesIO()
        np.lib.format.write_array_header_1_0(buffer, {"descr": "|O", "fortran_order": False, "shape": (1,)})
        return npz_of({**members, first: buffer.getvalue() + bytes(8)})
    if case == "corrupt-deflate":
        return corrupt_deflate(members)
    return npz_of(members)


NPZ_CASES = ["member-not-npy", "header-asks-for-terabytes", "truncated-array", "object-array", "corrupt-deflate"]
JSON_CASES = ["float-out-of-range", "missing-field", "outcome-not-a-mapping"]


@pytest.mark.parametrize("case", NPZ_CASES + JSON_CASES)
def test_a_kept_run_whose_digest_matches_but_does_not_decode_is_not_used(tmp_path, case):
    cell, outcome = kept_cell(tmp_path)
    doc = json.loads(cell.read_text())
    with zipfile.ZipFile(workdir.npz_path(cell)) as archive:
        members = {info.filename: archive.read(info) for info in archive.infolist()}
    payload = rewrite(members, case) if case in NPZ_CASES else workdir.npz_path(cell).read_bytes()
    if case == "float-out-of-range":
        doc["outcome"]["repeats_max_abs_diff"] = 10**400
    elif case == "missing-field":
        del doc["outcome"]["key"]["device"]
    elif case == "outcome-not-a-mapping":
        doc["outcome"] = [1, 2, 3]
    doc["npz_sha256"] = hashlib.sha256(payload).hexdigest()  # the digest matches what is there
    workdir.npz_path(cell).write_bytes(payload)
    cell.write_text(json.dumps(doc))
    tracemalloc.start()
    try:
        with pytest.raises(workdir.Unusable) as refused:
            workdir.load(cell, outcome.key)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "\n" not in str(refused.value) and peak < 16 * 2**20
    console = Console(file=io.StringIO(), width=400)
    assert workdir.taken({outcome.key: cell}, console) is None
    (note,) = console.file.getvalue().splitlines()
    assert note.startswith(f"  work folder: {cell} not used (") and note.endswith("); it runs again")


# --- 3b. the model's input against the images, before any training --------------------------


@pytest.mark.parametrize(
    "model, key",
    [({"input_shape": [1, 14, 56]}, "model.input_shape: [1, 14, 56]"), ({"input_width": 785}, "model.input_width: 785")],
    ids=["shape", "width"],
)
def test_validate_checks_the_input_against_the_image_files_header(tmp_path, capsys, model, key):
    """Images of 28 x 28 against an input of the same pixel count in another shape, or of
    another width: `validate` reads the file's header (not its data) and says so in one
    line, naming the file and the key; `run` refuses the same before it trains."""
    images = np.zeros((6, 28, 28), dtype=np.uint8)
    spec = write_idx_source(tmp_path, images, np.arange(6, dtype=np.uint8), validation=2)
    assert harness(capsys, "validate", spec, "--data-dir", tmp_path)[0] == 0
    doc = yaml.safe_load(spec.read_text())
    doc["model"].pop("input_width", None)
    doc["model"].update(model)
    if "input_shape" in model:  # a convolution first, so that the model itself places
        doc["model"]["layers"] = [{"kind": "conv2d", "filters": 2, "kernel": 3}, {"kind": "flatten"}, {"width": 10}]
    write_spec(spec, doc, {})
    code, _, err = harness(capsys, "validate", spec, "--data-dir", tmp_path)
    assert code == 2
    one_line_error(err, str(tmp_path / "bad-images-idx-ubyte"), "images of", key, str(spec))
    with pytest.raises(DataError, match=re.escape(key)):
        inputs.build_problem(load_spec(spec), tmp_path)


def test_an_idx_model_of_three_channels_is_refused_without_data(tmp_path, capsys):
    """IDX images have one channel: a spec that says three fails `validate` with no data file at all."""
    doc = yaml.safe_load((SPECS_DIR / "lenet_mnist.yaml").read_text())
    spec = write_spec(tmp_path / "rgb.yaml", doc, {"model__input_shape": [3, 28, 28]})
    code, _, err = harness(capsys, "validate", spec, "--data-dir", tmp_path)
    assert code == 2
    one_line_error(err, str(spec), "model.input_shape: [3, 28, 28] has 3 channels", "IDX images have one")


# --- 5. every count option bounded, every address checked, before any work ------------------


def _one_line_refusal(capsys, *args) -> str:
    """The command line run in this process (an option argparse refuses exits), refusing in one line."""
    from harness import cli

    try:
        code = cli.main([str(a) for a in args])
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    assert code == 2 and out == "", (args, out, err)
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: "), err
    return err


@pytest.mark.parametrize(
    "args, said",
    [
        (["run", "moons_net", "--repeats", "101"], "--repeats: at most 100 (each repeat is a whole timed training run): '101'"),
        (["run", "moons_net", "--repeats", "0"], "--repeats: must be positive"),
        (["bench", "moons_net", "--repeats", str(10**12)], "--repeats: at most 100"),
        (["sweep", "peaks_mlp", "--repeats", "-1"], "--repeats: must be positive"),
        (["run", "moons_net", "--jobs", str(10**30)], "--jobs: at most 1,024"),
        (["run", "moons_net", "--threads", "100000000"], "--threads: at most 1,024"),
        (["run", "moons_net", "--jobs", "nan"], "--jobs: not a whole number: 'nan'"),
        (["sweep", "peaks_mlp", "--values", ",".join(["10"] * 65)], "--values: at most 64 values"),
        (["smoke", "--steps", "1001"], "--steps: at most 1,000"),
        (["run", "moons_net", "--places", "a,b c"], "--places: not a list of names"),
        (["run", "moons_net", "--gpu-types", ",".join(f"g{i}" for i in range(65))], "--gpu-types: at most 64 names"),
    ],
)
def test_every_count_option_is_bounded_in_one_line(capsys, args, said):
    err = _one_line_refusal(capsys, *args)
    assert said in err, err


@pytest.mark.parametrize(
    "address",
    ["ray:", "ray:::1", "ray:host", "ray:host:0", "ray:host:65536", "ray:host:80/x", "ray:http://host:80"]
    + ["ray:-x:1", "ray:a b:1", "ray:$(id):1", "rays", "ray:" + "a" * 64 + ":1"],
)
def test_a_malformed_ray_address_is_refused_before_anything_runs(capsys, monkeypatch, address):
    """Refused as the options are read: before Ray is imported or a spec is loaded (Ray
    taken out of sys.modules first, where a test before this one imported it)."""
    monkeypatch.delitem(sys.modules, "ray", raising=False)
    err = _one_line_refusal(capsys, "run", "moons_net", "--executor", address)
    assert "--executor" in err and "ray" not in sys.modules


WELL_FORMED = ["ray", "local", "ray:auto", "ray:local", "ray:10.0.0.5:6379", "ray:head-1.cluster:6379", "ray:ray://head:10001", "ray:[::1]:6379"]


@pytest.mark.parametrize("address", WELL_FORMED)
def test_a_well_formed_executor_is_taken(address):
    from harness import arguments

    assert arguments.parser("x").parse_args(["run", "--executor", address]).executor == address


def test_local_jobs_and_threads_are_taken_up_to_the_cores_and_refused_past_them(capsys):
    from harness.execute import capacity, executors

    n = capacity.cores()
    assert executors.local_slots(n, None).jobs == n and executors.local_slots(None, n).threads == n  # at the limit
    assert executors.local_slots(1, n).threads == n
    for args, said in [
        (["--jobs", str(n + 1)], f"--jobs {n + 1}: more than this host's {n} cores"),
        (["--threads", str(n + 1)], f"--threads {n + 1}: more than this host's {n} cores"),
        (["--jobs", str(n), "--threads", "2"], f"--jobs {n} --threads 2: {2 * n} threads at once"),
    ]:
        err = _one_line_refusal(capsys, "run", "moons_net", "--no-records", *args)
        assert said in err, err
