"""The GPU half of the matrix, as far as it can be tested on any host: TF32 runs measured
against the oracle only and not gated, run-to-run differences measured, speedups taken
from records, a missing GPU stopping a required run with one line. The tests that need
a GPU are marked `gpu` and skip with the reason where there is none."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from harness.calibrate import spread
from harness.core import registry
from harness.core.registry import ORACLE_KEY, RunKey, gates
from harness.execute import plan
from harness.records import schema as records
from harness.records import store
from harness.report import speed
from harness.run import runner
from harness.verdict import checks, diagnosis
from tests.conftest import GPU_FRAMEWORKS, ROOT, key_for, quick_problem


def short(problem, epochs: int, k: int = 2):
    spec = problem.spec
    checks_section = spec.checks.model_copy(update={"params_after_steps": spec.checks.params_after_steps.model_copy(update={"step": k})})
    spec = spec.model_copy(update={"training": spec.training.model_copy(update={"epochs": epochs}), "checks": checks_section})
    return dataclasses.replace(problem, spec=spec)


def test_tf32_keys_are_gpu_only_and_labelled():
    keys = plan.matrix_keys(["torch", "jax"], ["cpu", "gpu"], tf32=True)
    tf32 = [k for k in keys if k.precision == "tf32"]
    assert [k.label for k in tf32] == ["torch@gpu+tf32", "jax@gpu+tf32"]
    assert not [k for k in plan.matrix_keys(["torch"], ["cpu"], tf32=True) if k.precision == "tf32"]


def test_a_tf32_run_is_judged_against_the_oracle_only_and_does_not_gate():
    """The plumbing, run on the CPU (where the TF32 switch changes nothing): a second
    precision mode enters the checks only against the oracle, and its failures are
    reported but do not fail the run."""
    problem = short(quick_problem("peaks_mlp"), epochs=5)
    tf32 = RunKey("numpy", "cpu", precision="tf32")
    keys = [RunKey("numpy", "cpu"), tf32, ORACLE_KEY]
    outcomes = {k: runner.run(problem, k) for k in keys}
    assert all(o.status == "ok" for o in outcomes.values())
    found = diagnosis.verdicts(problem.spec, outcomes, spread.Calibration(None, None))
    partners = {c.other(tf32) for c in found if c.involves(tf32)}
    assert partners == {ORACLE_KEY}
    assert not any(gates(c.a, c.b) for c in found if c.involves(tf32))
    assert all(gates(c.a, c.b) for c in found if not c.involves(tf32))


def _outcome_with(losses, params) -> runner.Outcome:
    outcome = runner.Outcome(RunKey("torch", "gpu"), "ok", losses=np.asarray(losses, float))
    outcome.final_params = params
    return outcome


def test_identical_repeats_are_bitwise_and_record_no_difference():
    params = {"dense1.weight": np.ones((2, 3), np.float32), "dense1.bias": np.zeros(3, np.float32)}
    outcome = _outcome_with([3.0, 2.0, 1.0], params)
    runner._compare_repeat(outcome, np.array([3.0, 2.0, 1.0]), {name: a.copy() for name, a in params.items()})
    assert outcome.repeats_bitwise_identical is True
    assert outcome.repeats_max_abs_diff is None and outcome.repeats_first_diff_step is None


def test_differing_repeats_record_how_far_and_from_which_step():
    params = {"dense1.weight": np.ones((2, 3), np.float32), "dense1.bias": np.zeros(3, np.float32)}
    outcome = _outcome_with([3.0, 2.0, 1.0, 0.5], params)
    other = {"dense1.weight": params["dense1.weight"] + np.float32(1e-3), "dense1.bias": params["dense1.bias"]}
    runner._compare_repeat(outcome, np.array([3.0, 2.0, 1.0 + 1e-7, 0.5 + 1e-6]), other)
    assert outcome.repeats_bitwise_identical is False
    assert outcome.repeats_first_diff_step == 2
    assert outcome.repeats_max_abs_diff == pytest.approx(1e-3, rel=1e-3)
    # a later identical repeat does not make the run bitwise again
    runner._compare_repeat(outcome, outcome.losses.copy(), params)
    assert outcome.repeats_bitwise_identical is False


def test_repeats_that_differ_only_in_parameters_are_caught():
    params = {"dense1.weight": np.ones((2, 2), np.float32), "dense1.bias": np.zeros(2, np.float32)}
    outcome = _outcome_with([1.0, 0.5], params)
    runner._compare_repeat(outcome, np.array([1.0, 0.5]), {"dense1.weight": params["dense1.weight"], "dense1.bias": np.full(2, 1e-8, np.float32)})
    assert outcome.repeats_bitwise_identical is False and outcome.repeats_first_diff_step == 2


def _copy_as(record: records.Record, device: str, per_step: float, transfer: float, precision: str = "strict"):
    timings = record.timings.model_copy(update={"per_step_s": per_step, "train_s": per_step * record.timings.total_steps, "transfer_s": transfer})
    return record.model_copy(
        update={
            "device": records.Device(kind=device, name="test GPU" if device == "gpu" else "test CPU"),
            "timings": timings,
            "precision_mode": precision,
            "created": "2026-01-01T00:00:00+00:00",
        }
    )


@pytest.fixture(scope="module")
def committed_cpu_records() -> list[records.Record]:
    """peaks' committed records of the runs that had no GPU (the lent machine's run is apart)."""
    found = [store.read(p) for p in sorted((ROOT / "results" / "peaks_mlp").glob("*.json"))]
    with_gpu = {r.run_id for r in found if r.device.kind == "gpu"}
    return [r for r in found if r.run_id not in with_gpu]


def test_the_committed_gpu_run_is_paired_with_its_own_hosts_cpu_runs_only():
    """The lent H100's records (results/peaks_mlp, its CPU and GPU cells in one run) give a
    speedup on that host; this VM's CPU records, under the same hostname `vm`, keep their rows
    without one (hosts are told apart by their cores too)."""
    found = [store.read(p) for p in sorted((ROOT / "results" / "peaks_mlp").glob("*.json"))]
    if not any(r.device.kind == "gpu" for r in found):
        pytest.skip("no GPU record is committed for peaks_mlp")
    rows = speed.speed_rows(found)
    gpu_hosts = {r.host.label for r in found if r.device.kind == "gpu"}
    assert len({r.host.hostname for r in found}) == 1 and len({r.host.label for r in found}) > 1  # one name, two machines
    for row in rows:
        assert (row.speedup is not None) == (row.cell.host in gpu_hosts), row


def test_speedups_pair_cpu_and_gpu_of_one_framework_with_and_without_transfers(committed_cpu_records):
    torch_cpu = next(r for r in committed_cpu_records if r.framework == "torch")
    cpu = _copy_as(torch_cpu, "cpu", per_step=0.004, transfer=0.01)
    gpu = _copy_as(torch_cpu, "gpu", per_step=0.0002, transfer=0.5)
    tf32 = _copy_as(torch_cpu, "gpu", per_step=0.0001, transfer=0.5, precision="tf32")
    oracle = next(r for r in committed_cpu_records if r.framework == "oracle")
    twin = _copy_as(torch_cpu, "gpu", per_step=0.0003, transfer=0.5, precision="float64")
    rows = {r.cell.precision: r for r in speed.speed_rows([cpu, gpu, tf32, oracle, twin])}
    assert set(rows) == {"strict", "tf32"}  # neither the oracle nor a float64 twin is a contestant
    steps = torch_cpu.timings.total_steps
    assert rows["strict"].speedup == pytest.approx(20.0)
    assert rows["strict"].speedup_with_transfers == pytest.approx((0.01 + 0.004 * steps) / (0.5 + 0.0002 * steps))
    assert rows["tf32"].cpu is cpu and rows["tf32"].speedup == pytest.approx(40.0)


def test_a_side_without_records_has_no_speedup_but_keeps_its_row(committed_cpu_records):
    rows = speed.speed_rows(committed_cpu_records)
    assert {r.cell.framework for r in rows} == {"torch", "jax", "numpy/cupy"}
    assert all(r.gpu is None and r.speedup is None and r.cpu is not None for r in rows)


def test_records_of_other_hosts_are_not_paired(committed_cpu_records):
    torch_cpu = next(r for r in committed_cpu_records if r.framework == "torch")
    gpu = _copy_as(torch_cpu, "gpu", per_step=0.0002, transfer=0.5)
    gpu = gpu.model_copy(update={"host": gpu.host.model_copy(update={"hostname": "elsewhere"})})
    assert all(r.speedup is None for r in speed.speed_rows([torch_cpu, gpu]))


def _harness(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, text=True, cwd=ROOT, timeout=600)


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this host has a GPU: the no-GPU path cannot be shown here")
def test_require_gpu_without_a_gpu_stops_with_one_line_and_writes_nothing(tmp_path):
    done = _harness("run", "peaks_mlp", "--devices", "cpu,gpu", "--require-gpu", "--results", str(tmp_path / "r"))
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: no usable CUDA GPU on this host (torch: ")
    assert "Traceback" not in done.stdout + done.stderr
    assert not list(tmp_path.rglob("*.json"))


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this host has a GPU: the no-GPU path cannot be shown here")
def test_gpu_alone_without_a_gpu_stops_before_any_work(tmp_path):
    """`run --devices gpu` asks for nothing the CPU would run: without a GPU it stops before
    any calibration, as --require-gpu does."""
    done = _harness("run", "peaks_mlp", "--devices", "gpu", "--results", str(tmp_path / "r"))
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.strip().startswith("error: no usable CUDA GPU on this host") and len(done.stderr.strip().splitlines()) == 1
    assert "calibration" not in done.stdout and not list(tmp_path.rglob("*.json"))


def test_require_gpu_needs_the_gpu_device():
    done = _harness("run", "peaks_mlp", "--require-gpu", "--no-records")
    assert done.returncode == 2 and "--require-gpu: add gpu to --devices" in done.stderr


def test_sweep_writes_ordinary_records_with_the_point_in_the_overrides(tmp_path):
    done = _harness("sweep", "peaks_mlp", "--values", "10", "--frameworks", "numpy", "--repeats", "1", "--no-floor", "--results", str(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    written = [store.read_record(p) for p in (tmp_path / "peaks_mlp").glob("*.json")]
    # numpy, its float64 twin, the oracle
    assert {(r.framework, r.precision_mode) for r in written} == {("numpy", "strict"), ("numpy", "float64"), ("oracle", "strict")}
    for record in written:
        assert record.spec.profile == "sweep" and record.data.n_train == 100
        assert record.spec.overrides == {"training": {"epochs": 100}, "data": {"points_per_axis": 10}}
        if record.precision_mode == "float64":  # the oracle's code: read from its run, not timed
            assert record.read_from == "oracle@cpu" and record.timings is None
        else:
            assert record.timings.total_steps == 100


def test_sweep_of_a_spec_without_one_is_bad_input():
    done = _harness("sweep", "moons_net")
    assert done.returncode == 2 and "sweep: the spec declares no sweep" in done.stderr


# --- on a GPU ---------------------------------------------------------------------------


def gpu_adapter(framework: str):
    adapter = registry.load(framework)  # the module only: frameworks load on use
    reason = adapter.unavailable(key_for(adapter, "gpu"))
    if reason:
        pytest.skip(reason)
    return adapter


@pytest.mark.gpu
@pytest.mark.parametrize("framework", GPU_FRAMEWORKS)
def test_gpu_repeats_are_bitwise_identical(framework):
    """Deterministic modes on: two runs of the same seeded problem on one GPU give the same bits."""
    gpu_adapter(framework)
    outcome = runner.run(short(quick_problem("peaks_mlp"), epochs=50), RunKey(framework, "gpu"), repeats=2)
    assert outcome.status == "ok", outcome.reason
    assert outcome.repeats_bitwise_identical, (outcome.repeats_max_abs_diff, outcome.repeats_first_diff_step)


@pytest.mark.gpu
@pytest.mark.parametrize("framework", GPU_FRAMEWORKS)
def test_gpu_strict_mode_agrees_with_the_oracle_over_the_horizon(framework):
    gpu_adapter(framework)
    problem = short(quick_problem("peaks_mlp"), epochs=20)
    gpu = runner.run(problem, RunKey(framework, "gpu"))
    oracle = runner.run(problem, ORACLE_KEY)
    assert gpu.status == "ok", gpu.reason
    assert checks.horizon_check(problem.spec, gpu.key, ORACLE_KEY, gpu.losses, oracle.losses).verdict == "pass"


def math_mode(framework: str, device: str, precision: str) -> dict:
    """The math mode an adapter reports for one run key, read in a fresh process as the
    matrix runs it."""
    code = (
        "import json, sys; from harness.core import registry; a = registry.load(sys.argv[1]);"
        "key = registry.RunKey(sys.argv[1], sys.argv[2], precision=sys.argv[3]);"
        "print(json.dumps(a.describe(key)['math_mode'], default=str))"
    )
    done = subprocess.run([sys.executable, "-c", code, framework, device, precision], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_math_mode_reader_runs_on_the_cpu():
    """The GPU test's reader, on the CPU, so that it cannot rot unseen between GPU leases (its
    import of a moved module failed on the first contact)."""
    pytest.importorskip("torch", reason="torch is not installed")
    assert math_mode("torch", "cpu", "strict")["deterministic_algorithms"] is True


@pytest.mark.gpu
@pytest.mark.parametrize("framework", GPU_FRAMEWORKS)
def test_the_precision_mode_is_what_the_record_says(framework):
    """Each mode in a fresh process, as the matrix runs it: the math mode the adapter reports."""
    gpu_adapter(framework)
    modes = {precision: math_mode(framework, "gpu", precision) for precision in ("strict", "tf32")}
    expected = {
        "torch": ("cuda.matmul.allow_tf32", False, True),
        "jax": ("jax_default_matmul_precision", "highest", "tensorfloat32"),
        "cupy": ("CUPY_TF32", "0", "1"),
    }
    key, strict, tf32 = expected[framework]
    assert (modes["strict"][key], modes["tf32"][key]) == (strict, tf32)
