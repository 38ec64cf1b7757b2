"""Mixed precision, the first step (issue 86): a bf16 cell per framework (torch's autocast on
the CPU, flax's modules in dtype=bfloat16 with float32 parameters), asked for by
`--precisions float32,bf16` or `precisions=[...]`, judged against the reference on the bf16
envelope (torch's autocast run and its members summing in other orders), measured and not
gated. The float32 runs and their verdicts are the same with or without it."""

from __future__ import annotations

import numpy as np
import pytest

import harness
from harness import arguments
from harness.core.registry import BF16, BF16_MEMBER_KEY, ORACLE_KEY, RunKey, gates
from harness.execute import plan
from harness.inputs.problem import build_problem
from harness.options import RunOptions
from harness.run import runner
from harness.spec.load import load_spec
from tests.helpers import tiny_moons


def test_precisions_are_an_option_of_the_command_line_and_the_api():
    argv = ["run", "peaks_mlp", "--precisions", "float32,bf16", "--no-records"]
    parsed = RunOptions.from_args(arguments.parser("harness").parse_args(argv))
    assert parsed == RunOptions(specs=["peaks_mlp"], precisions=["float32", "bf16"], results=None)
    assert RunOptions().precisions == ("float32",)
    with pytest.raises(harness.SpecError, match="precisions: unknown 'fp8'; choose from float32, bf16"):
        RunOptions(precisions=["fp8"])


def test_a_bf16_cell_is_planned_for_each_framework_that_has_one_with_the_envelopes_own_run():
    keys = plan.matrix_keys(["jax", "numpy"], ["cpu"], precisions=("float32", "bf16"))
    assert RunKey("jax", "cpu", precision=BF16) in keys and BF16_MEMBER_KEY in keys
    assert RunKey("numpy", "cpu", precision=BF16) not in keys  # the array-module code has no bf16 run yet
    assert plan.matrix_keys(["torch", "jax"], ["cpu"]) == plan.matrix_keys(["torch", "jax"], ["cpu"], precisions=("float32",))
    assert RunKey.from_label("jax@cpu+bf16") == RunKey("jax", "cpu", precision=BF16)
    assert not gates(RunKey("jax", "cpu", precision=BF16), ORACLE_KEY) and gates(RunKey("jax", "cpu"), ORACLE_KEY)
    assert plan.twin_keys(keys) == [RunKey("jax", "cpu", precision="float64"), RunKey("numpy", "cpu", precision="float64")]


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_a_bf16_run_computes_in_bf16_and_keeps_float32_parameters(tmp_path, framework):
    """Its losses leave the float32 run's by bf16's rounding (a few parts in a thousand), not
    float32's, and its parameters stay float32."""
    problem = build_problem(load_spec(tiny_moons(tmp_path)))
    float32 = runner.run(problem, RunKey(framework, "cpu"))
    bf16 = runner.run(problem, RunKey(framework, "cpu", precision=BF16))
    assert bf16.status == "ok", bf16.reason
    apart = np.abs(bf16.losses - float32.losses) / np.abs(float32.losses)
    assert 1e-5 < apart.max() < 0.1
    assert all(a.dtype == np.float32 for a in bf16.final_params.values())


def test_bf16_cells_are_judged_on_the_bf16_envelope_and_leave_the_float32_verdicts_alone(tmp_path):
    spec = tiny_moons(tmp_path)
    plain = harness.run_spec(spec, frameworks=["torch", "jax"], results=tmp_path / "plain")
    mixed = harness.run_spec(spec, frameworks=["torch", "jax"], precisions=["float32", "bf16"], results=tmp_path / "mixed")
    assert plain.passed and mixed.passed
    cells = {(r["framework"], r["precision_mode"]): r for r in mixed.records}
    assert {("torch", "bf16"), ("jax", "bf16")} <= cells.keys()
    for (framework, precision), record in {(r["framework"], r["precision_mode"]): r for r in plain.records}.items():
        kept = [c for c in cells[framework, precision]["checks"] if "+bf16" not in c["against"]]  # the reference's record judges them too
        assert kept == record["checks"], (framework, precision)  # bitwise the same verdicts
    judged = [c for c in cells["jax", "bf16"]["checks"] if c["verdict"] != "skipped"]
    assert judged and all(c["bound"]["dtype"] == "bf16" for c in judged if c["bound"]["factor"] is not None)
    assert {c["against"] for c in cells["jax", "bf16"]["checks"]} == {"oracle@cpu", "jax@cpu"}  # the reference and its own float32 run
    assert all(f.gated == ("+bf16" not in f.run and "+bf16" not in (f.reference or "")) for f in mixed.failures)
    assert cells["jax", "bf16"]["floor"] is None and cells["jax", "strict"]["floor"] is not None  # no bf16 product rate yet
    assert cells["torch", "bf16"]["precision"]["autocast"] == "bfloat16"
    assert cells["jax", "bf16"]["precision"]["flax_dtype"] == "bfloat16"


def test_a_failing_bf16_check_is_a_failure_not_gated_and_the_verdict_passes():
    """`Verdict.failures` lists a bf16 cell's failing check with `gated` False, and `passed`
    stays True: it is measured, not gated."""
    from types import SimpleNamespace

    from harness.records.store import read_record
    from harness.result import Verdict
    from tests.conftest import ROOT

    plain = read_record(next((ROOT / "baselines" / "cpu-quick").rglob("*.json")))
    failing = plain.checks[0].model_copy(update={"verdict": "fail", "against": "oracle@cpu", "diagnosis": "rounding: bf16 (...)"})
    mixed = plain.model_copy(update={"framework": "jax", "precision_mode": BF16, "status": "ok", "checks": [failing]})
    verdict = Verdict([SimpleNamespace(records=[mixed], member_records=[])], "")
    assert verdict.passed and [(f.run, f.gated) for f in verdict.failures] == [("jax@cpu+bf16", False)]
    gated = mixed.model_copy(update={"precision_mode": "strict"})
    strict = Verdict([SimpleNamespace(records=[gated], member_records=[])], "")
    assert not strict.passed and [(f.run, f.gated) for f in strict.failures] == [("jax@cpu", True)]


def test_no_float32_library_entry_covers_a_bf16_check():
    """optax's float32 bias corrections explain a float32 JAX run's check, never a bf16 one's:
    the catalogue's bounds are float32's (gpl_transformer's bf16 checks read `known` by them
    before this rule)."""
    from harness.spec import catalogue
    from harness.verdict.checks import Check
    from harness.verdict.diagnosis import covers

    (entry,) = [e for e in catalogue.library_differences() if e.id == "optax-adam-float32-bias-corrections"]
    check = lambda key: Check("params_after_step_1", key, ORACLE_KEY, "fail", "short_horizon")  # noqa: E731
    assert covers(entry, check(RunKey("jax", "cpu")))
    assert not covers(entry, check(RunKey("jax", "cpu", precision=BF16)))


def test_a_hub_style_port_runs_bf16_through_flax_models_dtype_judged_against_torchs_float64_run():
    """A port whose flax_model takes `dtype` (tests/hub_port) gets a bf16 cell on each side:
    torch's module under autocast, flax_model(dtype=jnp.bfloat16); each judged against the
    port's reference on the bf16 envelope."""
    from tests.conftest import ROOT

    verdict = harness.run_spec(ROOT / "tests" / "hub_port" / "hub_port.yaml", frameworks=["torch", "jax"], precisions=["float32", "bf16"])
    assert verdict.passed
    cells = {(r["framework"], r["precision_mode"]): r for r in verdict.records}
    assert cells["jax", "bf16"]["status"] == "ok" and cells["torch", "bf16"]["status"] == "ok"
    judged = [c for c in cells["jax", "bf16"]["checks"] if c["verdict"] != "skipped"]
    assert judged and {c["against"] for c in judged} == {"torch@cpu+float64", "jax@cpu"}  # the reference, its own float32 run
    assert all(c["bound"]["dtype"] == "bf16" for c in judged if c["bound"]["factor"] is not None)


def test_a_port_whose_flax_model_takes_no_dtype_is_refused_bf16_in_one_line(tmp_path):
    import flax.linen as nn

    from adapters import jax_port
    from harness.core.errors import Unsupported
    from tests.conftest import ROOT

    loaded = load_spec(ROOT / "examples" / "mlp_port" / "mlp_port.yaml")
    problem = build_problem(loaded, port_apart=None)
    with pytest.raises(Unsupported, match=r"a bfloat16 run calls flax_model\(dtype=jnp.bfloat16\); give flax_model a `dtype` keyword") as caught:
        jax_port.Network(problem, "float32", "bfloat16")
    assert "\n" not in str(caught.value)
    assert isinstance(jax_port.Network(problem, "float32").net, nn.Module)  # a float32 run's module is made as before
