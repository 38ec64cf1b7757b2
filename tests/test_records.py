"""Records: one schema, validated before writing, written atomically, never overwritten."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from rich.console import Console

from harness import matrix
from harness.core import provenance
from harness.core.errors import RecordError
from harness.core.registry import ORACLE_KEY, RunKey
from harness.execute import plan
from harness.records import build as recording
from harness.records import schema as records
from harness.records import store, write
from tests.conftest import ROOT


@pytest.fixture(scope="module")
def moons_result(tmp_path_factory):
    """The moons spec at 64 points and 8 hidden units, its quick profile 300 steps: every
    kind of record and check (re-anchored math parity too), in seconds."""
    from harness.inputs.problem import build_problem
    from harness.spec.load import load_spec
    from tests.helpers import tiny_moons

    spec = tiny_moons(
        tmp_path_factory.mktemp("spec"),
        training__epochs=400,
        profiles={"quick": {"training": {"epochs": 300}}},
        checks__params_after_steps__step=10,
        logging={"loss_every": 1, "print_every": 100},
    )
    loaded = load_spec(spec, "quick")
    problem = build_problem(loaded)
    out = tmp_path_factory.mktemp("results")
    keys = plan.matrix_keys(["numpy"], ["cpu"])
    result = matrix.run_cells(loaded, problem, keys, out, Console(file=io.StringIO()), repeats=2)
    return result, out


def test_committed_results_schema_is_current():
    assert (ROOT / "results" / "schema.json").read_text() == records.json_schema()


def test_one_valid_record_per_run_with_its_artifact(moons_result):
    jsonschema = pytest.importorskip("jsonschema")
    result, out = moons_result
    schema = json.loads((ROOT / "results" / "schema.json").read_text())
    assert len(result.paths) == 3  # numpy@cpu, the oracle, and numpy@cpu's float64 twin
    for path in result.paths:
        doc = json.loads(path.read_text())
        jsonschema.validate(doc, schema)
        assert doc["status"] == "ok" and doc["spec"]["profile"] == "quick" and doc["spec"]["overrides"]
        # the plain float32 run and the members that ran: none where every float32 check passes on it alone (the zeroth look)
        assert doc["calibration"]["float32_runs"] == 1 + len(result.members) and doc["calibration"]["twin_steps"] == 100
        twin = doc["precision_mode"] == "float64"  # NumPy's twin is the oracle's code: read from its run, not timed
        assert doc["read_from"] == ("oracle@cpu" if twin else None)
        if twin:
            assert doc["timings"] is None and doc["repeats_bitwise_identical"] is None
        elif doc["framework"] == "oracle":  # the reference runs once
            assert doc["timings"]["repeats"] == 1 and doc["repeats_bitwise_identical"] is None
        else:
            assert doc["timings"]["repeats"] == 2 and doc["repeats_bitwise_identical"] is True
        assert doc["host"]["cores"] >= 1 and doc["libraries"]["numpy"] == np.__version__
        assert doc["checks"] and {c["against"] for c in doc["checks"]} <= {"numpy@cpu", "oracle@cpu", "numpy@cpu+float64"}
        npz = path.with_name(doc["artifacts"]["file"])
        assert hashlib.sha256(npz.read_bytes()).hexdigest() == doc["artifacts"]["sha256"]
        with np.load(npz) as arrays:
            assert len(arrays["losses"]) == (doc["calibration"]["twin_steps"] if twin else doc["timings"]["total_steps"])
            assert doc["metrics"]["loss_curve"]["values"][0] == arrays["losses"][0]
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")]


def record_of(result: matrix.SpecResult, key: RunKey, run_id: str):
    where = provenance.collect()
    return recording.build_record(result.loaded, result.problem, result.outcomes[key], result.checks, result.calibration, run_id, where)


def test_oracle_record_is_labelled_float64(moons_result):
    result, _ = moons_result
    oracle = [json.loads(p.read_text()) for p in result.paths if "_oracle_" in p.name][0]
    assert oracle["dtype"] == "float64" and "oracle" in oracle["implementation"]


def test_records_are_never_overwritten(moons_result, tmp_path):
    result, _ = moons_result
    record, artifact = record_of(result, ORACLE_KEY, "run1")
    write.write_record(tmp_path, record, artifact)
    with pytest.raises(RecordError, match="never overwritten"):
        write.write_record(tmp_path, record, artifact)


def test_a_failed_write_leaves_nothing(moons_result, tmp_path, monkeypatch):
    result, _ = moons_result
    record, _ = record_of(result, RunKey("numpy", "cpu"), "run2")

    def broken_link(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "link", broken_link)
    with pytest.raises(RecordError, match="No space left"):
        write.write_record(tmp_path, record)
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


def test_unwritable_results_folder_is_reported(tmp_path):
    blocked = tmp_path / "file-not-folder"
    blocked.write_text("")
    with pytest.raises(RecordError, match="cannot be written"):
        write.ensure_writable(blocked / "results")


def test_foreign_json_is_not_a_record(tmp_path):
    path = tmp_path / "x.json"
    path.write_text(json.dumps({"hello": "world"}))
    with pytest.raises(RecordError, match="not a harness record"):
        store.read_record(path)


def test_a_record_names_the_blas_kernels_numpy_runs_on():
    """NumPy's bits depend on the BLAS kernel chosen for the CPU (peaks' float32 and float64
    runs changed under the same commit when this VM moved to a CPU with AVX-512), so the
    record says which was loaded. Checked by forcing OpenBLAS onto another kernel
    (OPENBLAS_CORETYPE): the record must name the one that runs, not the CPU's best."""
    program = "from harness.core import provenance; print(provenance.host_info().blas)"

    def blas(**env: str) -> str:
        done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, cwd=ROOT, env={**os.environ, **env}, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert "openblas" in blas()
    for core in ("Haswell", "Sandybridge"):
        assert f" {core}'" in blas(OPENBLAS_CORETYPE=core)


def test_records_from_before_numpy_had_its_name_are_read_as_numpy(tmp_path):
    """The committed records of 2026-11-23 say `cupy` for NumPy on the CPU; the store reads
    them as `numpy`, their checks' other side too, and a CuPy GPU record stays `cupy`."""
    from harness.records import store

    path = next(p for p in sorted((ROOT / "results" / "peaks_mlp").glob("*.json")) if json.loads(p.read_text())["framework"] == "cupy")
    raw, read = store.read_record(path), store.read(path)
    assert raw.framework == "cupy" and raw.device.kind == "cpu"
    assert read.framework == "numpy" and store.run_label(read) == "numpy@cpu"
    assert [c.against for c in read.checks] == [c.against.replace("cupy@cpu", "numpy@cpu") for c in raw.checks]
    torch = next(store.read(p) for p in sorted((ROOT / "results" / "peaks_mlp").glob("*.json")) if json.loads(p.read_text())["framework"] == "torch")
    assert "numpy@cpu" in {c.against for c in torch.checks} and "cupy@cpu" not in {c.against for c in torch.checks}
    gpu = raw.model_copy(update={"device": raw.device.model_copy(update={"kind": "gpu"})})
    gpu_path = tmp_path / "gpu.json"
    gpu_path.write_text(gpu.model_dump_json())
    assert store.read(gpu_path).framework == "cupy"


def test_each_check_keeps_its_rule_and_tolerance_as_fields(moons_result):
    from harness.gate.consistency import check_problems, record_problems
    from harness.verdict.rules import RULES

    result, _ = moons_result
    checked = [c for r in result.records for c in r.checks]
    assert checked and {c.bound.rule for c in checked} == {"short_horizon", "loss_curve_horizon", "envelope", "math_parity", "anchored_math_parity"}
    assert {c.bound.rule for c in checked} <= {r.name for r in RULES}
    written = [store.read_record(path) for path in result.paths]  # the artifact is named as it is written
    assert written and [p for r in written for p in record_problems(r)] == []
    calibrated = [c for c in checked if c.bound.factor is not None]
    # members: how many the spread was measured on (0 on the zeroth look: the floor alone)
    assert calibrated and all(c.bound.members is not None and c.bound.dtype in ("float32", "float64") for c in calibrated)
    # the check can fail: a tolerance that does not add up, and a pass beyond its tolerance
    c = calibrated[0]
    bent = c.model_copy(update={"bound": dataclasses.replace(c.bound, allowed=2 * c.bound.allowed)})
    assert check_problems(bent) and check_problems(c.model_copy(update={"ratio": 2.0, "verdict": "pass"}))


def test_leftovers_of_an_interrupted_writer_are_swept_and_nothing_else(tmp_path):
    """A kill -9 between a record's .npz and its .json leaves an orphan .npz (and maybe a
    temporary file): the next write into the folder removes them once they are old enough
    that no writer is still at work; a user's files and complete records stay."""
    folder = tmp_path / "peaks_mlp"
    folder.mkdir()
    orphan = folder / "20261124T091820Z_torch_cpu_quick_0fb44ae220bd.npz"
    temporary = folder / ".20261124T091820Z_torch_cpu_quick_0fb44ae220bd.json.abcd1234.tmp"
    complete = [folder / "20261124T091820Z_jax_cpu_quick_af2bb730ac14.json", folder / "20261124T091820Z_jax_cpu_quick_af2bb730ac14.npz"]
    mine = [folder / "notes.npz", folder / "my.tmp"]
    for path in [orphan, temporary, *complete, *mine]:
        path.write_bytes(b"x")
    young = write.sweep_leftovers(folder)
    assert young == []  # a writer may still be at work
    later = write.sweep_leftovers(folder, now=orphan.stat().st_mtime + write.LEFTOVER_AGE_S + 1)
    assert sorted(later) == sorted([orphan, temporary])
    assert all(p.exists() for p in [*complete, *mine])


def test_a_specs_records_are_written_together_or_not_at_all(moons_result, tmp_path, monkeypatch):
    """A full disk at the second record: the first is taken back with its artifact."""
    result, _ = moons_result
    made = [(r.model_copy(update={"record_id": f"{i:012x}", "artifacts": None}), b"npz") for i, r in enumerate(result.records)]
    real, calls = write.write_record, []

    def full_at_the_second(results_dir, record, artifact=None):
        calls.append(record)
        if len(calls) == 2:
            raise RecordError(f"{results_dir}: cannot write: No space left on device")
        return real(results_dir, record, artifact)

    monkeypatch.setattr(write, "write_record", full_at_the_second)
    with pytest.raises(RecordError, match="No space left"):
        matrix.write_together(tmp_path, made)
    assert len(calls) == 2 and not [p for p in tmp_path.rglob("*") if p.is_file()]


def test_a_dangling_results_link_is_refused_before_any_run(tmp_path):
    link = tmp_path / "results"
    link.symlink_to(tmp_path / "gone" / "nowhere")
    with pytest.raises(RecordError, match="is a link to nothing"):
        write.ensure_writable(link)
    with pytest.raises(RecordError, match="is a link to nothing"):
        write.ensure_writable(link / "deeper")


@pytest.mark.parametrize("name", ["../../etc/passwd", "/etc/passwd", "..", "a/b.npz", "x.json"])
def test_a_record_naming_an_artifact_outside_its_folder_does_not_read(tmp_path, name):
    record = store.read_record(next((ROOT / "results").rglob("*_torch_cpu_full_*.json")))
    doc = json.loads(record.model_dump_json())
    doc["artifacts"]["file"] = name
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(RecordError, match=r"r\.json: not a harness record \(schema 1\): artifacts\.file"):
        store.read_record(path)
