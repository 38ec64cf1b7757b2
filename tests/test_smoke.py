"""`harness smoke`, a machine's first call: its problems are the specs' networks on synthetic
inputs; each of its rows fails on a flag that reads other than its precision asks for, a
missing or non-finite loss, repeats with other bits, or a first loss or initial outputs far
from the oracle's; a documented limit of a fast mode is a skipped row, with its reason."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from harness import smoke
from harness.core.paths import SPECS_DIR
from harness.core.registry import FLOAT64, ORACLE_KEY, TF32, RunKey
from harness.spec.load import load_spec
from tests.conftest import ROOT

TORCH_GPU_STRICT = {
    "deterministic_algorithms": True,
    "cuda.matmul.allow_tf32": False,
    "cudnn.allow_tf32": False,
    "float32_matmul_precision": "highest",
    "cudnn.benchmark": False,
    "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
}


def _got(math_mode, losses=(1.0, 0.9, 0.8), outputs=None, bitwise=True):
    return {
        "status": "ok",
        "describe": {"version": "v", "device_name": "d", "math_mode": math_mode},
        "losses": np.asarray(losses),
        "outputs": np.ones((4, 2)) if outputs is None else outputs,
        "repeats_bitwise": bitwise,
        "seconds": 0.5,
    }


REFERENCE = {"status": "ok", "losses": np.asarray([1.0, 0.9, 0.8]), "outputs": np.ones((4, 2))}


def test_a_run_whose_flags_read_as_its_precision_asks_passes():
    row = smoke.judged("s", RunKey("torch", "gpu"), _got(TORCH_GPU_STRICT), REFERENCE, 3)
    assert row.passed and row.problems == []
    assert row.first_loss_distance == 0.0 and row.outputs_distance == 0.0


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("cuda.matmul.allow_tf32", True),
        ("cudnn.allow_tf32", True),
        ("deterministic_algorithms", False),
        ("cudnn.benchmark", True),
        ("CUBLAS_WORKSPACE_CONFIG", None),
    ],
)
def test_each_torch_gpu_flag_is_read_back(flag, value):
    row = smoke.judged("s", RunKey("torch", "gpu"), _got({**TORCH_GPU_STRICT, flag: value}), REFERENCE, 3)
    assert not row.passed
    assert row.problems == [f"{flag} reads {value!r}, not {' or '.join(map(repr, smoke.expected_flags(RunKey('torch', 'gpu'))[flag]))}"]


def test_a_tf32_run_must_read_tf32_on_and_the_twin_x64():
    tf32 = RunKey("torch", "gpu", precision=TF32)
    assert not smoke.judged("s", tf32, _got(TORCH_GPU_STRICT), REFERENCE, 3).passed
    on = {**TORCH_GPU_STRICT, "cuda.matmul.allow_tf32": True, "cudnn.allow_tf32": True, "float32_matmul_precision": "high"}
    assert smoke.judged("s", tf32, _got(on), REFERENCE, 3).passed
    twin = RunKey("jax", "gpu", precision=FLOAT64)
    jax_mode = {"jax_default_matmul_precision": "highest", "jax_enable_x64": True, "XLA_FLAGS": "--xla_gpu_deterministic_ops=true"}
    assert smoke.judged("s", twin, _got(jax_mode), REFERENCE, 3).passed
    row = smoke.judged("s", twin, _got({**jax_mode, "XLA_FLAGS": ""}), REFERENCE, 3)
    assert row.problems == ["xla_gpu_deterministic_ops reads False, not True"]
    assert smoke.expected_flags(RunKey("cupy", "gpu", precision=TF32)) == {"CUPY_TF32": ("1",)}


def test_a_loss_logged_in_another_slot_fails_a_row():
    """A log slot never written reads 0 (a scatter into the log gone wrong)."""
    row = smoke.judged("s", RunKey("numpy", "cpu"), _got({}, losses=(1.0, 0.0, 0.8)), REFERENCE, 3)
    assert row.problems == ["logged losses 9.00e-01 from the oracle's (bar 1e-03 for strict)"]


def test_missing_or_non_finite_losses_and_other_bits_fail_a_row():
    key = RunKey("numpy", "cpu")
    assert smoke.judged("s", key, _got({}, losses=(1.0, float("nan"), 0.8)), REFERENCE, 3).problems[0].startswith("losses logged")
    assert smoke.judged("s", key, _got({}, losses=(1.0, 0.9)), REFERENCE, 3).problems[0].startswith("losses logged")
    assert smoke.judged("s", key, _got({}, bitwise=False), REFERENCE, 3).problems == ["its two runs gave other bits"]


def test_the_oracle_bar_depends_on_the_precision():
    near = np.ones((4, 2)) * (1 + 5e-5)  # float32 rounding passes, float64's bar is far tighter
    assert smoke.judged("s", RunKey("jax", "cpu"), _got({**_jax_mode("highest")}, outputs=near), REFERENCE, 3).passed
    row = smoke.judged("s", RunKey("jax", "cpu", precision=FLOAT64), _got({**_jax_mode("highest", x64=True)}, outputs=near), REFERENCE, 3)
    assert row.problems == ["initial outputs 5.00e-05 from the oracle's (bar 1e-10 for float64)"]
    far = np.ones((4, 2)) * 1.1  # a layout or padding broken outright
    assert "initial outputs 1.00e-01" in smoke.judged("s", RunKey("jax", "cpu"), _got(_jax_mode("highest"), outputs=far), REFERENCE, 3).problems[0]
    wrong_shape = smoke.judged("s", RunKey("jax", "cpu"), _got(_jax_mode("highest"), outputs=np.ones((4, 3))), REFERENCE, 3)
    assert wrong_shape.outputs_distance == float("inf") and not wrong_shape.passed


def _jax_mode(precision, x64=False):
    return {"jax_default_matmul_precision": precision, "jax_enable_x64": x64, "XLA_FLAGS": "--xla_gpu_deterministic_ops=true"}


def test_a_failed_run_fails_its_row_and_a_skipped_one_says_why():
    failed = smoke.judged("s", RunKey("torch", "gpu"), {"status": "failed", "reason": "torch@gpu raised RuntimeError: x"}, REFERENCE, 3)
    assert not failed.passed and failed.problems == ["failed: torch@gpu raised RuntimeError: x"]
    skipped = smoke.judged("s", RunKey("numpy", "cpu", mode="fast"), {"status": "skipped", "reason": "dense networks only"}, REFERENCE, 3)
    assert skipped.passed and skipped.reason == "dense networks only"


@pytest.mark.parametrize("name", ["lenet_mnist", "moons_net", "mnist_adamw"])
def test_a_smoke_problem_has_the_specs_shapes_and_two_batch_sizes(name):
    spec = load_spec(SPECS_DIR / f"{name}.yaml", "quick").spec
    problem = smoke.smoke_problem(spec)
    assert problem.total_steps == smoke.STEPS
    assert problem.x_train.shape[1] == spec.model.in_features
    assert problem.initial_params.keys() == smoke.smoke_problem(spec).initial_params.keys()
    sizes = [problem.batch_size(t) for t in range(problem.total_steps)]
    if spec.training.batch_size == "full":
        assert sizes == [smoke.FULL_BATCH_ROWS] * smoke.STEPS
    else:
        assert sizes[:2] == [spec.training.batch_size] * 2 and 0 < sizes[2] < spec.training.batch_size
    assert np.array_equal(problem.x_train, smoke.smoke_problem(spec).x_train)  # seeded


def test_a_text_specs_smoke_problem_is_token_ids_of_its_context():
    spec = load_spec(SPECS_DIR / "gpl_transformer.yaml", "quick").spec
    problem = smoke.smoke_problem(spec)
    for a in (problem.x_train, problem.y_train):
        assert a.shape[1] == spec.model.tokens.context and a.dtype.kind == "i" and 0 <= a.min() and a.max() < 256


def test_the_groups_are_one_process_per_framework_device_and_precision():
    groups = smoke.keys_for(["torch", "numpy", "cupy"], ["cpu", "gpu"])
    labels = [[k.label for k in g] for g in groups]
    assert ["torch@cpu", "torch@cpu:fast"] in labels and ["numpy@cpu+float64"] in labels
    assert ["torch@gpu+tf32"] in labels and ["cupy@gpu+tf32"] in labels
    assert not any(label.startswith(("numpy@gpu", "cupy@cpu")) for group in labels for label in group)
    assert not any("tf32" in label for group in labels for label in group if "@cpu" in label)


@pytest.mark.slow
def test_the_smoke_on_this_cpu_passes_with_a_skipped_fast_mode_and_writes_its_json(tmp_path):
    """Every framework on a CNN (conv, max pool), an AdamW recipe and a transformer: rows ok, but the fast
    modes that do not take them (torch's takes no recipe, the array-module code's dense
    networks only), skipped with the reason."""
    pytest.importorskip("torch", reason="torch is not installed")
    pytest.importorskip("flax", reason="flax is not installed")
    out = tmp_path / "smoke.json"
    done = subprocess.run(
        [sys.executable, "-m", "harness", "smoke", "lenet_mnist", "mnist_adamw", "gpl_transformer", "--devices", "cpu", "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    found = json.loads(out.read_text())
    assert found["passed"] and found["oracle"][0]["label"] == ORACLE_KEY.label
    rows = {(r["spec"], r["label"]): r for r in found["rows"]}
    assert rows["mnist_adamw", "torch@cpu:fast"]["status"] == "skipped"
    assert rows["mnist_adamw", "numpy@cpu:fast"]["status"] == "skipped"
    assert rows["lenet_mnist", "numpy@cpu:fast"]["status"] == "skipped"  # a CNN: dense networks only
    assert rows["lenet_mnist", "jax@cpu:fast"]["status"] == "ok"
    for row in found["rows"]:
        if row["status"] == "ok":
            assert row["repeats_bitwise"] is True and len(row["losses"]) == smoke.STEPS
            assert row["outputs_distance"] <= smoke.BARS[RunKey.from_label(row["label"]).precision]
    assert "max_pool" in found["coverage"]["layers"] and "schedule warmup_cosine" in found["coverage"]["recipes"]
    assert {"attention", "dropout", "residual"} <= set(found["coverage"]["layers"])  # a residual's body counts
    assert rows["gpl_transformer", "jax@cpu:fast"]["status"] == "ok"  # a transformer, attention and RoPE
    assert "runs ok, 5 skipped, 0 failed" in done.stdout


def test_smoke_asked_for_a_gpu_where_there_is_none_stops_with_one_line():
    pytest.importorskip("torch", reason="torch is not installed")
    done = subprocess.run(
        [sys.executable, "-m", "harness", "smoke", "peaks_mlp", "--devices", "gpu", "--frameworks", "numpy,torch"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    if done.returncode == 0:
        pytest.skip("this host has a GPU")
    assert done.returncode == 2 and done.stderr.strip().count("\n") == 0, done.stderr
    assert "GPU" in done.stderr


def test_an_interrupted_smoke_keeps_its_rows_in_its_json_and_exits_130(tmp_path, monkeypatch):
    """A lease's budget ends the smoke with SIGINT (tools/device-run.sh contact): the rows it
    ran are written, marked interrupted and not passed, and the command exits 130."""
    from harness import cli

    calls = []

    def in_this_process_then_interrupted(call, *args):
        calls.append(args[1])
        if len(calls) == 3:  # the oracle's process, the first group's, then Ctrl-C
            raise KeyboardInterrupt
        return call(*args)

    monkeypatch.setattr(smoke, "in_fresh_process", in_this_process_then_interrupted)
    out = tmp_path / "smoke.json"
    code = cli.main(["smoke", "peaks_mlp", "--frameworks", "numpy", "--devices", "cpu", "--out", str(out)])
    found = json.loads(out.read_text())
    assert code == 130 and found["interrupted"] and not found["passed"]
    first = [k.label for k in calls[1]]
    assert [r["label"] for r in found["rows"]] == first and all(r["status"] == "ok" for r in found["rows"])
    assert len(calls) == 3 and found["oracle"][0]["status"] == "ok"
