"""Faults and hostile input: the spec loader under fuzzing, interrupted runs, concurrent
writers. Nothing may crash obscurely, and no half-written record may be left."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.core import provenance
from harness.core.errors import RecordError, SpecError
from harness.core.paths import SPECS_DIR
from harness.records import store, write
from harness.spec.load import parse_document, validate_document
from harness.spec.model import FULL_PROFILE
from harness.spec.yamlsafe import MAX_DEPTH
from tests.conftest import ROOT
from tests.helpers import interruptible, tiny_moons

PEAKS_DOC = yaml.safe_load((SPECS_DIR / "peaks_mlp.yaml").read_text())
SCALARS = st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=True) | st.text(max_size=12)
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
FUZZ = settings(max_examples=150, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))


def paths_of(doc, prefix=()):
    """Every key path into a nested document."""
    if isinstance(doc, dict):
        for key, value in doc.items():
            yield (*prefix, key)
            yield from paths_of(value, (*prefix, key))
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            yield (*prefix, i)
            yield from paths_of(value, (*prefix, i))


PATHS = list(paths_of(PEAKS_DOC))


def loads_or_spec_error(doc) -> None:
    try:
        validate_document(Path("fuzz.yaml"), doc)
    except SpecError as exc:
        assert str(exc).startswith("fuzz.yaml")


@FUZZ
@given(st.text(max_size=300))
def test_any_text_parses_or_gives_a_spec_error(text):
    try:
        doc = parse_document(Path("fuzz.yaml"), text)
    except SpecError:
        return
    loads_or_spec_error(doc)


@FUZZ
@given(st.lists(st.tuples(st.sampled_from(PATHS), VALUES | st.just("<delete>")), min_size=1, max_size=4))
def test_mutated_specs_load_or_give_a_spec_error(mutations):
    import copy

    doc = copy.deepcopy(PEAKS_DOC)
    for path, value in mutations:
        parent = doc
        try:
            for key in path[:-1]:
                parent = parent[key]
            if value == "<delete>":
                del parent[path[-1]]
            else:
                parent[path[-1]] = value
        except (KeyError, IndexError, TypeError):
            continue  # an earlier mutation removed this path
    loads_or_spec_error(doc)


@FUZZ
@given(VALUES)
def test_any_document_loads_or_gives_a_spec_error(doc):
    if isinstance(doc, dict):
        loads_or_spec_error(doc)
    else:
        with pytest.raises(SpecError):
            parse_document(Path("fuzz.yaml"), yaml.safe_dump(doc))


PEAKS_LINES = (SPECS_DIR / "peaks_mlp.yaml").read_text().splitlines()
# The lines `key: value` of the peaks spec whose value is on the line (not a block scalar).
KEYED_LINES = [i for i, line in enumerate(PEAKS_LINES) if re.fullmatch(r" *[a-z_0-9]+: +[^#|> ].*", line)]
NAMES = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_", min_size=1, max_size=8)


@FUZZ
@given(st.sampled_from(KEYED_LINES), NAMES, st.booleans())
def test_an_anchor_or_alias_anywhere_gives_a_spec_error(index, name, alias):
    lines = list(PEAKS_LINES)
    key, value = lines[index].split(": ", 1)
    lines[index] = f"{key}: *{name}" if alias else f"{key}: &{name} {value.lstrip()}"
    with pytest.raises(SpecError, match=rf"^fuzz.yaml: line {index + 1}: YAML anchors and aliases are not allowed"):
        parse_document(Path("fuzz.yaml"), "\n".join(lines))


@FUZZ
@given(st.sampled_from(KEYED_LINES), VALUES.map(json.dumps))  # JSON is YAML's flow style
def test_a_duplicate_key_anywhere_gives_a_spec_error(index, value):
    lines = list(PEAKS_LINES)
    key = lines[index].split(": ", 1)[0]
    lines.insert(index + 1, f"{key}: {value}")
    with pytest.raises(SpecError, match=rf"^fuzz.yaml: line {index + 2}: duplicate key '{key.strip()}'"):
        parse_document(Path("fuzz.yaml"), "\n".join(lines))


@settings(FUZZ, max_examples=30)  # the scanner reads a deep line to its end: 0.15 s at 20,000 levels
@given(st.integers(MAX_DEPTH + 1, 20_000), st.sampled_from(["[", "{a: ", "[{b: ", "{a: ["]), st.sampled_from(KEYED_LINES))
def test_deep_nesting_anywhere_gives_a_spec_error(depth, opener, index):
    lines = list(PEAKS_LINES)
    key = lines[index].split(": ", 1)[0]
    lines[index] = f"{key}: {opener * depth}"
    with pytest.raises(SpecError, match=rf"^fuzz.yaml: line {index + 1}: nested deeper than {MAX_DEPTH} levels"):
        parse_document(Path("fuzz.yaml"), "\n".join(lines))


def run_cli(results: Path, spec: str | Path = "moons_net", *profile: str) -> subprocess.Popen:
    """`harness run` of `spec` with numpy, its records into `results`; the moons spec's quick
    profile by default."""
    profile = profile or ("--profile", "quick")
    return subprocess.Popen(
        [sys.executable, "-m", "harness", "run", str(spec), *profile, "--frameworks", "numpy", "--no-floor", "--results", str(results)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=interruptible,
    )


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_an_interrupted_run_leaves_no_record(tmp_path, sig):
    """Interrupted mid-training: moons at its full size (20,000 steps), so the signal finds
    it running, whatever the suite's load (the child's SIGINT unblocked: helpers.interruptible)."""
    proc = run_cli(tmp_path, "moons_net", "--profile", FULL_PROFILE)
    deadline = time.monotonic() + 60
    line = ""
    while "step" not in line and time.monotonic() < deadline:  # interrupt it mid-training
        line = proc.stdout.readline()
    assert proc.poll() is None, "the run ended before it was interrupted"
    os.kill(proc.pid, sig)
    proc.wait(timeout=60)
    assert proc.returncode != 0
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]


def test_an_interrupt_inside_the_write_leaves_nothing(tmp_path, monkeypatch):
    record = store.read_record(next((ROOT / "baselines" / "cpu-quick").rglob("*.json")))

    def interrupted(fd):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write.write_record(tmp_path, record)
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]


@pytest.mark.slow
def test_two_runs_writing_at_once_do_not_clobber(tmp_path):
    spec = tiny_moons(tmp_path)  # two runs of seconds, writing their records at the same moment
    results = tmp_path / "results"
    first, second = run_cli(results, spec, "--profile", "full"), run_cli(results, spec, "--profile", "full")
    assert first.wait(timeout=300) == 0 and second.wait(timeout=300) == 0
    written = sorted(results.rglob("*.json"))
    assert len(written) == 6 and len({p.name for p in written}) == 6  # 3 records (numpy, oracle, numpy's twin) each
    for path in written:
        store.read_record(path)


def test_a_results_folder_that_cannot_be_written_changes_nothing(tmp_path):
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the folder should be")
    done = subprocess.run(
        [sys.executable, "-m", "harness", "run", "moons_net", "--profile", "quick", "--results", str(blocked / "r")],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "cannot be written" in done.stderr
    with pytest.raises(RecordError):
        write.ensure_writable(blocked / "r")


def test_a_specs_records_folder_that_is_a_file_stops_the_run_before_it_starts(tmp_path):
    """--results whose folder for the spec is a file: one line, exit 2, before any run (it
    was a FileExistsError traceback after the whole matrix had run)."""
    results = tmp_path / "results"
    results.mkdir()
    (results / "moons_net").write_text("a file where the spec's folder should be")
    done = subprocess.run(
        [sys.executable, "-m", "harness", "run", str(tiny_moons(tmp_path)), "--results", str(results)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and not done.stdout
    assert done.stderr == f"error: {results / 'moons_net'}: the folder of moons_net's records cannot be written: not a folder\n"


def test_a_work_dir_that_cannot_be_written_stops_the_run_before_it_starts(tmp_path):
    """Not every cell run and none kept: one line, exit 2, before anything runs."""
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the folder should be")
    done = subprocess.run(
        [sys.executable, "-m", "harness", "run", str(tiny_moons(tmp_path)), "--no-records", "--work-dir", str(blocked / "w")],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and not done.stdout
    assert done.stderr == f"error: {blocked / 'w'}: the work folder cannot be written: not a folder\n"


@pytest.mark.slow
def test_a_work_dir_keeps_finished_runs_for_the_next_call(tmp_path):
    """A long matrix split over calls (or resumed after a crash) runs each cell once; the
    records of the second call carry the first call's numbers. The moons spec at 64 points
    and 300 steps: long enough for re-anchored segments, over in seconds."""
    work = tmp_path / "work"
    spec = tiny_moons(tmp_path, training__epochs=300, checks__params_after_steps__step=10, logging={"loss_every": 1, "print_every": 100})
    base = [sys.executable, "-m", "harness", "run", str(spec), "--no-floor", "--work-dir", str(work)]
    first = subprocess.run([*base, "--frameworks", "numpy", "--no-records"], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "finished earlier" not in first.stdout
    # numpy@cpu, the oracle, the oracle's first steps, numpy's float64 twin and its re-anchored
    # run; every check passes on the zeroth look (harness/calibrate/roles.py ZEROTH): no member
    kept = list(work.rglob("*.json"))
    assert len(kept) == 5 and "zeroth look" not in first.stdout, first.stdout
    second = subprocess.run(
        [*base, "--frameworks", "numpy,torch", "--results", str(tmp_path / "r")], capture_output=True, text=True, cwd=ROOT, timeout=600
    )
    assert second.returncode == 0, second.stdout + second.stderr
    reused = [line for line in second.stdout.splitlines() if "finished earlier" in line]
    # every cell of the first call; torch, its twin and its re-anchored twin run (and the first
    # look's members, where one of torch's checks does not pass on the zeroth)
    assert len(reused) == len(kept)
    assert "moons_net torch@cpu (float32" in second.stdout
    written = {r.framework: r for r in map(store.read_record, (tmp_path / "r" / "moons_net").glob("*.json"))}
    assert set(written) == {"numpy", "torch", "oracle"} and all(r.status == "ok" for r in written.values())


def test_ctrl_c_during_the_last_cell_says_interrupted_and_the_next_call_resumes_from_the_kept_cells(tmp_path):
    """`harness run --work-dir` interrupted (SIGINT to its process group) while its last job
    runs, every other cell taken from the work folder: `interrupted`, exit 130 (it was
    `KeyError: RunKey(...)`: the job's process died of the same INT and had no outcome);
    the next call takes the kept cells and runs the rest."""
    from harness.core.threads import cores

    if cores() < 2:
        pytest.skip("two jobs at once (the last cell running alone) need two cores")
    work = tmp_path / "work"
    spec = tiny_moons(tmp_path, training__epochs=3000, checks__params_after_steps__step=10, logging={"loss_every": 1, "print_every": 100})
    base = [sys.executable, "-m", "harness", "run", str(spec), "--frameworks", "numpy", "--no-floor", "--no-records", "--jobs", "2"]
    base += ["--work-dir", str(work)]  # two jobs at once, in every call: a cell is kept for its threads too
    first = subprocess.run(base, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert first.returncode == 0, first.stdout + first.stderr
    (cell,) = [p for p in work.rglob("numpy-cpu-*.json") if "float64" not in p.name]
    cell.unlink()  # numpy@cpu runs again, alone: the twins' cells are taken at once beside it
    interrupted = subprocess.Popen(
        base, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True, preexec_fn=interruptible
    )
    said = []
    for line in interrupted.stdout:
        said.append(line)
        if "moons_net numpy@cpu step 100/3000" in line:  # its process trains, for half a second more
            os.killpg(interrupted.pid, signal.SIGINT)
            break
    said += interrupted.stdout.readlines()
    assert interrupted.wait(timeout=60) == 130 and said[-1] == "interrupted\n", "".join(said)
    resumed = subprocess.run(base, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert resumed.stdout.count("finished earlier") >= 4 and "numpy@cpu" in resumed.stdout


def test_a_work_dir_cell_is_keyed_by_the_host_fingerprint_not_its_name(tmp_path, monkeypatch):
    """A fresh lent machine (another hostname, the same CPU, GPU and libraries) reuses the
    cells a work folder carried from the last one; another GPU model does not."""
    from harness.core.registry import RunKey
    from harness.execute import workdir
    from harness.inputs import problem as inputs
    from harness.spec.load import load_spec

    loaded = load_spec(SPECS_DIR / "peaks_mlp.yaml", "quick")
    problem = inputs.build_problem(loaded)
    key = RunKey("torch", "gpu")

    def cell(hostname: str, gpus: list[str]) -> Path:
        monkeypatch.setattr(provenance.platform, "node", lambda: hostname)
        monkeypatch.setattr(provenance, "_gpu_names", lambda: gpus)
        return workdir.job_path(tmp_path, loaded, problem, key, 1, workdir.machine())

    here = cell("lent-1", ["NVIDIA H100 80GB HBM3"])
    assert cell("lent-2", ["NVIDIA H100 80GB HBM3"]) == here
    assert cell("lent-2", ["NVIDIA H200"]) != here


def test_the_host_fingerprint_holds_while_other_blas_libraries_load():
    """SciPy's OpenBLAS arrives with scikit-learn (the moons data): the work cells' key must
    not change with it, or a resumed matrix would run its cells again."""
    program = (
        "from harness.core import provenance; before = provenance.host_fingerprint(); import sklearn.datasets; "
        "print(before == provenance.host_fingerprint(), len(provenance.host_info().blas))"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    same, loaded = done.stdout.split()
    assert same == "True" and int(loaded) >= 2  # both BLAS libraries loaded, one fingerprint


def _exit_at_once() -> None:
    os._exit(3)


def _sleep_writing_pid(path: str) -> None:
    Path(path).write_text(str(os.getpid()))
    time.sleep(120)


def test_a_fresh_process_returns_its_result_or_says_it_died():
    from harness.execute.fresh import ProcessDied, in_fresh_process

    assert in_fresh_process(os.getpid) != os.getpid()
    with pytest.raises(ProcessDied):
        in_fresh_process(_exit_at_once)


def test_a_fresh_process_dies_with_its_parent_even_on_sigkill(tmp_path):
    """kill -9 of the harness must not leave its run process training on."""
    pid_file = tmp_path / "child.pid"
    program = (
        "from harness.execute.fresh import in_fresh_process; from tests.test_faults import _sleep_writing_pid; "
        f"in_fresh_process(_sleep_writing_pid, {str(pid_file)!r})"
    )
    parent = subprocess.Popen([sys.executable, "-c", program], cwd=ROOT)
    try:
        deadline = time.monotonic() + 120
        while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
            time.sleep(0.1)
        child = int(pid_file.read_text())
        parent.kill()
        parent.wait(timeout=30)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.kill(child, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)
        os.kill(child, signal.SIGKILL)
        pytest.fail("the fresh process outlived its SIGKILLed parent")
    finally:
        parent.kill()


def test_ctrl_c_ends_a_fresh_process_without_its_traceback(tmp_path):
    """Ctrl-C reaches the whole process group: the child ends by SIGINT's default action, so
    only the parent's own line is printed, also when it lands as the child starts."""
    from harness.execute.fresh import in_fresh_process

    assert in_fresh_process(signal.getsignal, signal.SIGINT) == signal.SIG_DFL
    for delay in (0.02, 0.1, 0.3, 0.6, 1.0):  # during the child's start, and once it runs
        program = (
            "import os, signal, threading, time; from harness.execute.fresh import in_fresh_process\n"
            f"threading.Timer({delay}, lambda: os.killpg(0, signal.SIGINT)).start()\n"
            "try:\n    in_fresh_process(time.sleep, 20)\nexcept KeyboardInterrupt:\n    print('interrupted')\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, timeout=120, start_new_session=True, preexec_fn=interruptible
        )
        assert done.stdout.strip() == "interrupted" and "Traceback" not in done.stderr, (delay, done.stdout, done.stderr)
