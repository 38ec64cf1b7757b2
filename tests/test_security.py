"""Hostile input: files in the work folder, git revisions, output paths, resource bombs.
Each case ends in exit 2 with one line (or, for the work folder, in the run going again),
and nothing is executed or written."""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import json
import math
import os
import pickle
import stat
import struct
import subprocess
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import yaml
from rich.console import Console

from harness import cli
from harness.core import git as gitrev
from harness.core.errors import DataError, HarnessError
from harness.core.paths import SPECS_DIR
from harness.core.registry import RunKey
from harness.execute import workdir
from harness.inputs import data
from harness.run.runner import Outcome
from tests.conftest import ROOT
from tests.helpers import a_sample_outcome, harness, one_line_error, tiny_moons, write_spec

# --- 1. the work folder holds data, never code ------------------------------------------


class Planted:
    """A pickle that creates `marker` when it is loaded."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return open, (str(self.marker), "w")


def same(a, b) -> bool:
    """Equal in value and in type, all the way down (int keys stay ints, tuples tuples)."""
    if isinstance(a, np.ndarray):
        return type(b) is np.ndarray and a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b, equal_nan=True)
    if dataclasses.is_dataclass(a):
        return type(a) is type(b) and all(same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    if isinstance(a, dict):
        return type(b) is dict and list(a) == list(b) and all(type(k) is type(j) for k, j in zip(a, b)) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and (a == b or (a != a and b != b))


def test_every_field_of_an_outcome_survives_the_work_folder(tmp_path):
    outcome = a_sample_outcome()
    cell = tmp_path / "cell.json"
    workdir.save(cell, outcome)
    json.loads(cell.read_text())  # data a person can read
    back = workdir.load(cell, outcome.key)
    for field in dataclasses.fields(Outcome):
        assert same(getattr(outcome, field.name), getattr(back, field.name)), field.name


def test_a_kept_run_of_another_key_or_a_changed_npz_is_not_used(tmp_path):
    outcome = a_sample_outcome()
    cell = tmp_path / "cell.json"
    workdir.save(cell, outcome)
    with pytest.raises(workdir.Unusable, match="holds torch@gpu"):
        workdir.load(cell, RunKey("jax", "cpu"))
    npz = workdir.npz_path(cell)
    npz.write_bytes(npz.read_bytes() + b"\0")
    with pytest.raises(workdir.Unusable, match="sha256"):
        workdir.load(cell, outcome.key)


@pytest.mark.parametrize(("change", "why"), [({"losses": np.zeros(0)}, "no loss curve"), ({"metrics": {}}, "without its metrics")])
def test_a_kept_run_that_is_incomplete_is_not_used(tmp_path, change, why):
    """A finished run kept with an empty loss curve or without its metrics (written by hand:
    its digest matches) runs again, said in one line; it was an IndexError, or reused
    without a word."""
    outcome = dataclasses.replace(a_sample_outcome(), status="ok", reason=None, **change)
    cell = tmp_path / "cell.json"
    workdir.save(cell, outcome)
    with pytest.raises(workdir.Unusable, match=why):
        workdir.load(cell, outcome.key)
    out = io.StringIO()
    assert workdir.taken({outcome.key: cell}, Console(file=out, width=300)) is None
    assert f"{cell} not used" in out.getvalue() and why in out.getvalue()


def plant_pickles(cells: list[Path], marker: Path, digest_matches: bool) -> None:
    """A pickle that creates `marker`, under each cell's old name (.pkl) and new names (.json,
    .npz); or, with `digest_matches`, as the .npz of a .json that names its sha256."""
    payload = pickle.dumps(Planted(marker))
    for cell in cells:
        cell.with_suffix(".pkl").write_bytes(payload)
        workdir.npz_path(cell).write_bytes(payload)
        if digest_matches:
            doc = json.loads(cell.read_text())
            doc["npz_sha256"] = hashlib.sha256(payload).hexdigest()
            cell.write_text(json.dumps(doc))
        else:
            cell.write_bytes(payload)


@pytest.mark.parametrize("digest_matches", [False, True], ids=["pickles-everywhere", "pickle-npz-with-its-digest"])
def test_a_planted_pickle_in_the_work_folder_is_never_loaded(tmp_path, capsys, digest_matches):
    spec, work, marker = tiny_moons(tmp_path), tmp_path / "work", tmp_path / "executed"
    run = ("run", spec, "--frameworks", "numpy", "--no-records", "--no-floor", "--in-process", "--work-dir", work)
    assert harness(capsys, *run)[0] == 0
    cells = sorted(work.rglob("*.json"))
    # numpy, the oracle; the oracle's first steps and numpy's float64 twin (math parity). No
    # member: every check passes on the zeroth look (harness/calibrate/roles.py ZEROTH)
    assert len(cells) == 4
    pickle.loads(pickle.dumps(Planted(tmp_path / "control")))
    assert (tmp_path / "control").exists()  # the planted payload does run when unpickled

    plant_pickles(cells, marker, digest_matches)
    code, out, _ = harness(capsys, *run)
    assert code == 0 and not marker.exists()
    notes = [line for line in out.splitlines() if "work folder:" in line]
    assert len(notes) == len(cells) and all("not used" in line and "it runs again" in line for line in notes), out
    assert "finished earlier" not in out
    code, out, _ = harness(capsys, *run)  # run again, and kept again as data
    assert code == 0 and out.count("finished earlier") == len(cells) and not marker.exists()


# --- 3. export replaces only regular files ----------------------------------------------


def test_export_refuses_a_fifo_a_device_or_a_link_and_writes_nothing(tmp_path, capsys):
    spec = tiny_moons(tmp_path)
    fifo, link = tmp_path / "out.npz", tmp_path / "link.npz"
    os.mkfifo(fifo)
    link.symlink_to(tmp_path / "elsewhere.npz")
    before = sorted(tmp_path.iterdir())
    for out in (fifo, Path("/dev/full"), link):
        code, _, err = harness(capsys, "export", spec, "--out", out)
        assert code == 2
        one_line_error(err, str(out), "not a regular file")
    assert sorted(tmp_path.iterdir()) == before and stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert not (tmp_path / "elsewhere.npz").exists()


def test_export_replaces_a_regular_file_through_a_temporary_one(tmp_path, capsys):
    spec, out = tiny_moons(tmp_path), tmp_path / "out.npz"
    out.write_bytes(b"old")
    assert harness(capsys, "export", spec, "--out", out)[0] == 0
    with np.load(out, allow_pickle=False) as npz:
        assert len(npz["oracle_losses"]) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.npz", "tiny_moons.yaml"]
    assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~current_umask()


def current_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# --- 2. git revisions are checked before git sees them ----------------------------------


@pytest.mark.skipif(not (ROOT / ".git").exists(), reason="not a git checkout: no refs to resolve")
def test_a_revision_is_a_full_sha_or_a_ref_git_resolves():
    head = gitrev.checked_revision("HEAD", "--baseline")
    assert gitrev.FULL_SHA.fullmatch(head)
    assert gitrev.checked_revision(head.upper(), "--baseline") == head
    for bad in ("", "-p", "--output=/tmp/x", "HEAD\n", "no-such-ref-anywhere", "HEAD:README.md"):
        with pytest.raises(HarnessError, match="^--baseline: "):
            gitrev.checked_revision(bad, "--baseline")


def test_compare_refuses_a_baseline_revision_that_is_an_option(tmp_path, capsys):
    victim = tmp_path / "victim"
    victim.write_text("untouched")
    code, _, err = harness(capsys, "compare", tmp_path, "--baseline", f"git:--output={victim}")
    assert code == 2
    one_line_error(err, "--baseline", "is not a git revision")
    assert victim.read_text() == "untouched"


def test_report_refuses_a_record_whose_commit_is_an_option(tmp_path, capsys):
    """The report looks for a record's spec in git at the record's commit (here no file
    has the record's sha256): `git show --output=...` would write a file."""
    victim = tmp_path / "victim"
    (tmp_path / "victim:specs").mkdir()  # where `git show --output=VICTIM:specs/moons_net.yaml` would write
    source = next((ROOT / "baselines" / "cpu-quick" / "moons_net").glob("*.json"))
    doc = json.loads(source.read_text())
    doc["git"]["commit"] = f"--output={victim}"
    doc["spec"]["sha256"] = "0" * 64
    results = tmp_path / "results"
    (results / "moons_net").mkdir(parents=True)
    (results / "moons_net" / source.name).write_text(json.dumps(doc))
    code, _, err = harness(capsys, "report", "--results", results, "--profile", "quick")
    assert code == 2
    one_line_error(err, f"record {doc['record_id']}: git.commit", "is not a git revision")
    assert not list((tmp_path / "victim:specs").iterdir()) and not (results / "REPORT.md").exists()


@pytest.mark.parametrize(
    ("key", "value"),
    [(("spec", "name"), "../../escaped"), (("spec", "profile"), "quick/../../x"), (("framework",), "../torch"), (("record_id",), "../../x")],
)
def test_a_record_whose_names_would_leave_its_folder_is_refused(tmp_path, capsys, key, value):
    """A record's spec name, profile, framework and id become parts of paths (its own file's,
    the report's figures'): one with "../" in them is not a harness record, and `report`
    exits 2 naming the record's key, with nothing written anywhere."""
    source = next((ROOT / "baselines" / "cpu-quick" / "peaks_mlp").glob("*.json"))
    doc = json.loads(source.read_text())
    holder = doc
    for part in key[:-1]:
        holder = holder[part]
    holder[key[-1]] = value
    results = tmp_path / "deep" / "results"
    (results / "peaks_mlp").mkdir(parents=True)
    (results / "peaks_mlp" / source.name).write_text(json.dumps(doc))
    before = sorted(tmp_path.rglob("*"))
    code, _, err = harness(capsys, "report", "--results", results, "--profile", "quick")
    assert code == 2
    one_line_error(err, ".".join(key), "should match pattern")
    assert sorted(tmp_path.rglob("*")) == before


def test_a_figure_name_that_is_a_path_is_refused():
    from harness.report.document import Document

    with pytest.raises(HarnessError, match="not a figure's name"):
        Document().figure("../escaped", "a caption", lambda: None, lambda _: b"png")


# --- 4. resource limits -------------------------------------------------------------------


@pytest.mark.parametrize(
    "changes, fragments",
    [
        ({"model__layers__0__width": 10**9}, ["GiB of memory", "the limit is 8 GiB (--max-memory-gb raises it)"]),
        ({"training__epochs": 10**30}, ["training.epochs: about 10^30 training steps", "(--max-steps raises it)"]),
        ({"training__epochs": 1e18}, ["training.epochs: about 10^18 training steps", "(--max-steps raises it)"]),
        ({"training__epochs": 1e30}, ["training.epochs"]),
        ({"data__n_samples": 10**24}, [": about 10^", "GiB of memory for about 10^24 examples"]),  # "about" said once
        ({"checks__loss_curve__rtol": math.inf}, ["checks.loss_curve.rtol", "finite"]),
        ({"optimizer__lr": math.nan}, ["optimizer.lr", "finite"]),
        ({"checks__long_run__curve_floor": -math.inf}, ["checks.long_run.curve_floor", "finite"]),
    ],
    ids=["width-1e9", "epochs-10**30", "epochs-1e18", "epochs-1e30", "samples-10**24", "inf-rtol", "nan-lr", "minus-inf-floor"],
)
def test_validate_refuses_a_spec_past_the_limits_or_not_finite(tmp_path, capsys, changes, fragments):
    spec = tiny_moons(tmp_path, **changes)
    code, out, err = harness(capsys, "validate", spec)
    assert code == 2 and not out
    one_line_error(err, str(spec), *fragments)


@pytest.mark.parametrize(
    "changes, option, value",
    [({"model__layers__0__width": 10**7}, "--max-memory-gb", "20"), ({"training__epochs": 2 * 10**7}, "--max-steps", "30000000")],
)
def test_an_option_raises_the_limit(tmp_path, capsys, changes, option, value):
    spec = tiny_moons(tmp_path, **changes)
    assert harness(capsys, "validate", spec)[0] == 2
    assert harness(capsys, "validate", spec, option, value)[0] == 0


def test_the_limits_hold_where_the_problem_is_built(tmp_path, capsys):
    spec = tiny_moons(tmp_path)
    code, _, err = harness(capsys, "run", spec, "--max-steps", "2", "--results", tmp_path / "r", "--no-floor")
    assert code == 2 and not list(tmp_path.glob("r/*"))
    one_line_error(err, "3 training steps on 64 examples; the limit is 2")
    code, _, err = harness(capsys, "export", spec, "--max-memory-gb", "1e-6", "--out", tmp_path / "x.npz")
    assert code == 2 and not (tmp_path / "x.npz").exists()
    one_line_error(err, "GiB of memory for 64 examples")


def test_an_idx_data_set_is_measured_once_its_files_are_read(tmp_path, capsys, mnist_dir):
    """validate cannot know an IDX data set's size; the run learns it from the files."""
    args = ("mnist_mlp", "--profile", "quick", "--data-dir", mnist_dir, "--data-source", "test-set", "--max-memory-gb", "0.01")
    code, _, err = harness(capsys, "run", *args, "--results", tmp_path / "r", "--no-floor")
    assert code == 2 and not list(tmp_path.glob("r/*"))
    one_line_error(err, "GiB of memory for 8,000 examples")


def test_a_sweep_of_100000_points_per_axis_is_refused_before_anything_runs(tmp_path, capsys):
    results = tmp_path / "r"
    code, out, err = harness(capsys, "sweep", "peaks_mlp", "--values", "10,100000", "--results", results, "--no-floor")
    assert code == 2 and not out and not results.exists()
    one_line_error(err, "peaks_mlp.yaml (profile sweep): about", "10,000,000,000 examples", "--max-memory-gb")


def idx(array: np.ndarray, code: int, shape: tuple[int, ...] | None = None) -> bytes:
    """An IDX file of `array` (its header may claim another `shape`)."""
    dims = shape or array.shape
    return bytes([0, 0, code, len(dims)]) + struct.pack(f">{len(dims)}I", *dims) + array.tobytes()


def gzip_bomb(header: bytes, gib: int) -> bytes:
    """`header`, then `gib` GiB of zeros, gzip-compressed to about a megabyte (gzip members
    of 1 MiB of zeros, one after another: gzip readers take them as one stream)."""
    member = gzip.compress(bytes(2**20), compresslevel=9)
    return gzip.compress(header) + member * (1024 * gib)


IMAGES = np.zeros((10, 28, 28), dtype=np.uint8)
LABELS = np.arange(10, dtype=np.uint8)


@pytest.mark.parametrize(
    "images, labels, fragment",
    [
        (gzip_bomb(idx(IMAGES, 0x08)[:16], 1), gzip.compress(idx(LABELS, 0x08)), "truncated or oversized IDX data: more than 7840 bytes"),
        (gzip.compress(idx(IMAGES[:0], 0x08, (2**32 - 1,) * 3)), gzip.compress(idx(LABELS, 0x08)), "more than the 2,147,483,648 allowed"),
        (gzip.compress(idx(IMAGES, 0x08)), gzip.compress(idx(np.arange(-1, 9, dtype=np.int8), 0x09)), "labels must be class indices"),
        (gzip.compress(idx(IMAGES, 0x08)), gzip.compress(idx(LABELS * 20, 0x08)), "labels go up to 180, but"),
    ],
    ids=["gzip-bomb", "header-overflow", "negative-labels", "labels-past-the-outputs"],
)
def test_bad_idx_data_exits_two_without_reading_it_whole(tmp_path, capsys, images, labels, fragment):
    files = {"images": ("bad-images-idx3-ubyte.gz", images), "labels": ("bad-labels-idx1-ubyte.gz", labels)}
    source = {"validation": 2}
    for role, (name, payload) in files.items():
        (tmp_path / name).write_bytes(payload)
        source[role] = {"file": name, "sha256": hashlib.sha256(payload).hexdigest()}
    doc = yaml.safe_load((SPECS_DIR / "mnist_mlp.yaml").read_text())
    spec = write_spec(tmp_path / "bad.yaml", doc, {"data__sources": {"bad": source}, "data__source": "bad", "profiles": {}})
    code, _, err = harness(capsys, "run", spec, "--data-dir", tmp_path, "--no-records", "--no-floor", "--in-process")
    assert code == 2
    one_line_error(err, fragment)


def test_a_gzip_bomb_is_not_decompressed(tmp_path):
    path = tmp_path / "bomb.gz"
    path.write_bytes(gzip_bomb(idx(IMAGES, 0x08)[:16], 4))
    tracemalloc.start()
    try:
        with pytest.raises(DataError, match="more than 7840 bytes"):
            data.read_idx(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * 2**20


# --- 5. bad input that must not crash -------------------------------------------------


BILLION_LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n" + "".join(
    f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]\n" for p, c in zip("bcdefgh", "cdefghi")
)


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("[" * 20_000, "line 1: nested deeper than 64 levels"),
        ("a:\n" + "".join(" " * i + f"k{i}:\n" for i in range(1, 200)), "nested deeper than 64 levels"),
        (BILLION_LAUGHS, "line 1: YAML anchors and aliases are not allowed in a spec (&a)"),
        ("name: peaks_mlp\ntraining: {epochs: 1}\ntraining: {epochs: 10}\n", "line 3: duplicate key 'training'"),
        ("training: {epochs: 1, epochs: 10}\n", "line 1: duplicate key 'epochs'"),
        ("a: 1" + "0" * 5000 + "\n", "not valid YAML"),
    ],
    ids=["deep-flow", "deep-block", "alias-bomb", "duplicate-section", "duplicate-key", "5000-digit-int"],
)
def test_hostile_yaml_exits_two_with_one_line(tmp_path, capsys, text, fragment):
    spec = tmp_path / "hostile.yaml"
    spec.write_text(text)
    code, out, err = harness(capsys, "validate", spec)
    assert code == 2 and not out
    one_line_error(err, str(spec), fragment)


def test_a_file_name_too_long_exits_two(tmp_path, capsys):
    long = "a" * 300
    code, _, err = harness(capsys, "validate", tmp_path / f"{long}.yaml")
    assert code == 2
    one_line_error(err, "file name too long")
    code, _, err = harness(capsys, "run", "mnist_mlp", "--data-dir", tmp_path / long, "--no-records", "--no-floor")
    assert code == 2
    one_line_error(err, "file name too long")
    assert list(tmp_path.iterdir()) == []


def test_a_framework_named_twice_runs_once(tmp_path, capsys):
    spec = tiny_moons(tmp_path)
    code, out, _ = harness(capsys, "run", spec, "--frameworks", "numpy,numpy", "--no-records", "--no-floor", "--in-process")
    assert code == 0 and out.count("moons_net numpy@cpu (float32") == 1


def test_ctrl_c_prints_one_line_and_exits_130(tmp_path, capsys, monkeypatch):
    def interrupted(args, console):
        raise KeyboardInterrupt

    monkeypatch.setitem(cli.COMMANDS, "validate", interrupted)
    code, out, err = harness(capsys, "validate")
    assert code == 130 and not out and err.strip() == "interrupted"


def test_the_known_differences_file_is_read_like_a_spec(tmp_path):
    """No aliases (an alias bomb), no duplicate keys: the library file gets the spec's loader."""
    from harness.core.errors import SpecError
    from harness.spec import catalogue

    bomb = tmp_path / "known.yaml"
    bomb.write_text("- &a {id: x}\n- *a\n")
    with pytest.raises(SpecError, match="anchors and aliases"):
        catalogue.library_differences(bomb)
    twice = tmp_path / "twice.yaml"
    twice.write_text("- {id: x, id: y}\n")
    with pytest.raises(SpecError, match="twice.yaml"):
        catalogue.library_differences(twice)


def test_report_out_refuses_a_fifo_and_writes_nothing(tmp_path, capsys):
    """`report --out` replaces only a regular file: a FIFO stays a FIFO, no figures appear."""
    fifo = tmp_path / "REPORT.md"
    os.mkfifo(fifo)
    code, _, err = harness(capsys, "report", "--results", str(ROOT / "baselines" / "cpu-quick"), "--out", fifo)
    assert code == 2
    one_line_error(err, str(fifo), "not a regular file")
    assert sorted(tmp_path.iterdir()) == [fifo] and stat.S_ISFIFO(os.lstat(fifo).st_mode)


@pytest.mark.parametrize("target", ["/etc", "../../outside"])
def test_a_baseline_tree_with_a_link_out_of_its_folder_is_one_line(tmp_path, capsys, monkeypatch, target):
    """`compare --baseline git:REV` unpacks results/ at REV: a crafted tree whose link points
    out of the folder is refused in one line, and nothing is written outside."""
    repo = tmp_path / "repo"
    (repo / "results").mkdir(parents=True)
    (repo / "results" / "escape").symlink_to(target)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "-C", str(repo), "add", "-A"], check=True)
    subprocess.run([*git, "-C", str(repo), "commit", "-q", "-m", "crafted"], check=True)
    monkeypatch.chdir(repo)
    code, _, err = harness(capsys, "compare", ROOT / "baselines" / "cpu-quick", "--baseline", "git:HEAD")
    assert code == 2
    one_line_error(err, "git:HEAD", "cannot unpack results/")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["repo"]


def idx_spec(folder: Path, labels: np.ndarray, **changes) -> Path:
    """The MNIST spec on a 10-image IDX source of `labels` (2 of them for validation)."""
    files = {
        "images": ("v-images-idx3-ubyte.gz", gzip.compress(idx(IMAGES, 0x08))),
        "labels": ("v-labels-idx1-ubyte.gz", gzip.compress(idx(labels, 0x08))),
    }
    source = {"validation": 2}
    for role, (name, payload) in files.items():
        (folder / name).write_bytes(payload)
        source[role] = {"file": name, "sha256": hashlib.sha256(payload).hexdigest()}
    doc = yaml.safe_load((SPECS_DIR / "mnist_mlp.yaml").read_text())
    return write_spec(folder / "bad.yaml", doc, {"data__sources": {"bad": source}, "data__source": "bad", "profiles": {}, **changes})


def test_a_label_past_the_outputs_in_the_validation_split_is_one_line_before_any_run(tmp_path, capsys):
    """Only the validation split holds the bad label: found when the data is read, not by
    the runs dying with an IndexError."""
    doc = yaml.safe_load((SPECS_DIR / "mnist_mlp.yaml").read_text())
    val = np.random.default_rng(doc["data"]["split_seed"]).permutation(len(LABELS))[:2]
    labels = LABELS.copy()
    labels[val[0]] = 200
    spec = idx_spec(tmp_path, labels)
    code, out, err = harness(capsys, "run", spec, "--data-dir", tmp_path, "--no-records", "--no-floor", "--in-process")
    assert code == 2 and "Verdicts" not in out
    one_line_error(err, "v-labels-idx1-ubyte.gz: labels go up to 200", str(spec))


def test_a_step_check_past_the_end_of_the_run_is_bad_input(tmp_path, capsys):
    """Where the spec knows its data's size, validation says so; for IDX data, known once
    its files are read, the run stops there, before any run (it used to skip the check)."""
    code, _, err = harness(capsys, "validate", tiny_moons(tmp_path, checks__params_after_steps__step=4))  # 3 steps
    assert code == 2 and "checks.params_after_steps.step: beyond the last training step" in err
    spec = idx_spec(tmp_path, LABELS, checks__params_after_steps__step=1000)
    code, out, err = harness(capsys, "run", spec, "--data-dir", tmp_path, "--no-records", "--no-floor", "--in-process")
    assert code == 2 and "Verdicts" not in out
    one_line_error(err, str(spec), "checks.params_after_steps.step: 1000 is past the run's last step")


def test_a_union_key_is_one_line_not_one_per_member(tmp_path, capsys):
    spec = tiny_moons(tmp_path, training__batch_size=0)
    code, _, err = harness(capsys, "validate", spec)
    assert code == 2
    one_line_error(err, str(spec), "training.batch_size: Input should be greater than 0 or Input should be 'full'")


def test_a_download_with_no_place_for_the_data_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HOME", "/dev/null")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.delenv("HARNESS_DATA_DIR", raising=False)
    code, _, err = harness(capsys, "run", "mnist_mlp", "--profile", "quick", "--frameworks", "numpy", "--download", "--no-records")
    assert code == 2
    one_line_error(err, "/dev/null/.cache/repro-harness/data: cannot make the data folder for --download")
