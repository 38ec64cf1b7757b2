"""The oracle, its members and the float32 calibration run on the GPU through CuPy
(`harness run --references gpu`, issue 38): on a GPU host the CPU's oracle and members took
longer than the GPU runs they judge (docs/gpu-machine.md). The array-module code already
speaks CuPy; what is tested here, on the CPU, is the path: NumPy stands in for CuPy under
its name, so that the references "on the GPU" compute what the CPU's compute, bit for bit,
and every check, record and diagnosis must come out the same but for where the
references ran, which the records say."""

from __future__ import annotations

import dataclasses
import io
import types

import numpy as np
import pytest
from rich.console import Console

from adapters import xp_adapter
from harness import matrix
from harness.calibrate import roles
from harness.core.registry import CALIBRATION_KEY, GPU_CALIBRATION_KEY, GPU_ORACLE_KEY, ORACLE_KEY, CheckVerdict, RunKey
from harness.execute import plan
from harness.inputs.problem import build_problem
from harness.spec.load import load_spec
from tests.helpers import harness, one_line_error, tiny_moons


@pytest.fixture
def numpy_as_cupy(monkeypatch):
    """NumPy under CuPy's name for the array-module adapter's GPU path."""
    fake = types.ModuleType("cupy")
    fake.__dict__.update({k: getattr(np, k) for k in dir(np) if not k.startswith("__")})
    fake.__version__ = f"numpy {np.__version__} standing in for cupy"
    fake.asnumpy = np.asarray
    fake.is_available = lambda: True
    fake.cuda = types.SimpleNamespace(get_current_stream=lambda: types.SimpleNamespace(synchronize=lambda: None))
    monkeypatch.setattr(xp_adapter, "_cupy", lambda precision: fake)
    cpu = xp_adapter._describe

    def describe(device: str) -> dict:
        return {**cpu("cpu"), "library": "cupy (numpy standing in)"} if device == "gpu" else cpu(device)

    monkeypatch.setattr(xp_adapter, "_describe", describe)
    return fake


def on_gpu(key: RunKey) -> RunKey:
    """Where a key of the CPU's references runs with --references gpu (its twin too)."""
    if key.framework == ORACLE_KEY.framework:
        return dataclasses.replace(key, device="gpu")
    if (key.framework, key.device) == (CALIBRATION_KEY.framework, CALIBRATION_KEY.device):
        return dataclasses.replace(key, framework=GPU_CALIBRATION_KEY.framework, device="gpu")
    return key


def matrix_of(tmp_path, references: str, spec_changes: dict | None = None):
    # 8 steps: re-anchored segments of 2 steps from the oracle's states at steps 2, 4 and 6
    changes = {"training__epochs": 8, "checks__math_parity": {"steps": 2}, **(spec_changes or {})}
    loaded = load_spec(tiny_moons(tmp_path, **changes))
    problem = build_problem(loaded, None)
    keys = plan.matrix_keys(["torch"], ["cpu"], references=references)
    return matrix.run_cells(loaded, problem, keys, tmp_path / references, Console(file=io.StringIO()))


def test_the_keys_of_references_on_the_gpu_are_cupys_and_the_oracles_there(tmp_path):
    on_gpu = plan.matrix_keys(["torch", "numpy"], ["cpu"], references="gpu")
    assert on_gpu[-2:] == [GPU_CALIBRATION_KEY, GPU_ORACLE_KEY] and ORACLE_KEY not in on_gpu
    assert RunKey("numpy", "cpu") in on_gpu  # asked for: still a framework run, judged against the GPU's oracle
    assert plan.matrix_keys(["torch"], ["cpu"])[-2:] == [CALIBRATION_KEY, ORACLE_KEY]
    scheme = roles.GPU_ORACLE_SCHEME
    problem = build_problem(load_spec(tiny_moons(tmp_path)), None)
    assert roles.scheme_of(problem) == roles.ORACLE_SCHEME
    assert roles.scheme_of(dataclasses.replace(problem, references="gpu")) == scheme
    seeds = roles.member_seeds(problem, scheme=scheme)
    assert seeds and all(key.device == "gpu" and key.framework == "cupy" for key, _ in seeds)
    seeds64 = roles.member_seeds(problem, "float64", scheme=scheme)
    assert seeds64 and all(key.device == "gpu" and key.framework == "oracle" for key, _ in seeds64)


@pytest.mark.parametrize("changes", [{}, {"optimizer": {"kind": "adam", "lr": 0.01}}], ids=["sgd", "adam"])
def test_references_on_the_gpu_judge_as_the_cpus_do(tmp_path, numpy_as_cupy, changes):
    """With NumPy standing in for CuPy, the references "on the GPU" give the same checks as
    the CPU's: every verdict, ratio and error the same, against oracle@gpu; the records
    say where the oracle and the calibration run ran."""
    cpu = matrix_of(tmp_path, "cpu", changes)
    gpu = matrix_of(tmp_path, "gpu", changes)
    assert cpu.checks and len(cpu.checks) == len(gpu.checks)
    for a, b in zip(cpu.checks, gpu.checks):
        assert (a.name, on_gpu(a.a), on_gpu(a.b)) == (b.name, b.a, b.b)
        assert (a.verdict, a.ratio, a.max_abs_error) == (b.verdict, b.ratio, b.max_abs_error), (a.name, a.a.label, a.b.label)
    assert any(c.b == GPU_ORACLE_KEY and c.verdict == CheckVerdict.PASS for c in gpu.checks)
    assert gpu.calibration.reference == GPU_ORACLE_KEY and gpu.calibration.member == GPU_CALIBRATION_KEY
    assert all(m.key.device == "gpu" for m in gpu.members) and all(m.key.framework == "oracle" for m in gpu.members64)
    by_key = {(r.framework, r.device.kind): r for r in gpu.records if r.precision_mode == "strict"}
    assert ("oracle", "gpu") in by_key and ("cupy", "gpu") in by_key and ("oracle", "cpu") not in by_key
    assert "CuPy (on the GPU)" in by_key["oracle", "gpu"].implementation
    assert "the references ran on the GPU" in by_key["cupy", "gpu"].implementation
    np.testing.assert_array_equal(cpu.outcomes[ORACLE_KEY].losses, gpu.outcomes[GPU_ORACLE_KEY].losses)
    # the oracle kept its states on the GPU too: the re-anchored twins were judged
    anchored = [c for c in gpu.checks if c.name.endswith("anchored_loss_curve")]
    assert anchored and all(c.verdict == CheckVerdict.PASS and c.b == GPU_ORACLE_KEY for c in anchored)


def test_references_on_the_gpu_without_one_stop_in_one_line(tmp_path, capsys):
    code, _, err = harness(capsys, "run", tiny_moons(tmp_path), "--frameworks", "torch", "--devices", "cpu", "--references", "gpu", "--no-records")
    assert code == 2
    one_line_error(err, "--references gpu: the oracle runs through CuPy")
