"""The array-module code's bf16 run (harness/reference/autocast.py, issue 86): NumPy's values
rounded to bfloat16 where torch's autocast on the CPU computes in bfloat16, measured against
torch 2.13's own autocast run."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from harness.core.registry import BF16, RunKey
from harness.inputs.problem import build_problem
from harness.reference import autocast
from harness.run import runner
from harness.spec.load import load_spec
from tests.conftest import ROOT
from tests.helpers import tiny_moons


def test_the_bits_rounding_is_ml_dtypes_bfloat16_rounding():
    """CuPy's rounding (no bfloat16 there) on the float32 bits, run by NumPy: ml_dtypes' own
    on random values, halfway ties (to even), subnormals, infinities and NaN."""
    rng = np.random.default_rng(0)
    values = np.concatenate(
        [
            rng.standard_normal(100_000).astype(np.float32) * np.float32(10.0) ** rng.integers(-30, 30, 100_000).astype(np.float32),
            (np.arange(1 << 16, dtype=np.uint32) << 16 | np.uint32(0x8000)).view(np.float32),  # every tie
            np.array([0.0, -0.0, 1e-40, -1e-42, np.inf, -np.inf, np.nan, 3.4e38], dtype=np.float32),
        ]
    )
    want = values.astype(ml_dtypes.bfloat16).astype(np.float32)
    got = autocast.bits_rounding(np)(values)
    assert np.array_equal(np.isnan(got), np.isnan(want))  # ml_dtypes warns on casting NaN
    finite = ~np.isnan(want)
    assert np.array_equal(got[finite].view(np.uint32), want[finite].view(np.uint32))
    assert np.array_equal(autocast.rounding(np)(values)[finite].view(np.uint32), want[finite].view(np.uint32))


def _runs(spec, profile: str):
    problem = build_problem(load_spec(spec, profile))
    return {f: runner.run(problem, RunKey(f, "cpu", precision=BF16)) for f in ("torch", "numpy")}


def test_a_bf16_mlp_run_of_the_array_module_code_is_torchs_autocast_run_to_float32s_rounding(tmp_path):
    """Where torch's autocast rounds to bfloat16, NumPy's bf16 run rounds: its losses within a
    few float32 units of torch's bf16 run's, where NumPy's float32 run, rounding nowhere to
    bfloat16, is bf16's rounding away (over 100 times further)."""
    problem = build_problem(load_spec(tiny_moons(tmp_path)))
    runs = {f: runner.run(problem, RunKey(f, "cpu", precision=BF16)) for f in ("torch", "numpy")}
    torch, numpy = runs["torch"], runs["numpy"]
    assert torch.status == numpy.status == "ok", (torch.reason, numpy.reason)
    float32 = runner.run(problem, RunKey("numpy", "cpu"))
    apart = np.abs(numpy.losses - torch.losses) / np.abs(torch.losses)
    assert apart.max() < 4 * 2.0**-24
    assert np.min(np.abs(float32.losses - torch.losses) / np.abs(torch.losses)) > 100 * 4 * 2.0**-24
    computed = numpy.describe["math_mode"]["computed_in"]
    assert computed == torch.describe["math_mode"]["computed_in"]
    assert computed["loss"] == computed["parameters"] == "float32" and "bfloat16" in computed.values()


def test_a_conv_nets_layers_compute_in_the_dtypes_torchs_autocast_gives_them():
    """cnn_norm_mnist (conv, batch norm, average pool, layer norm, dropout): each layer's output
    dtype is torch's under autocast on the CPU (a dropout's float32 in training: its float32
    mask multiplied in), and the first step's loss within a few float32 units of torch's."""
    runs = _runs(ROOT / "specs" / "cnn_norm_mnist.yaml", "quick")
    torch, numpy = runs["torch"], runs["numpy"]
    assert torch.status == numpy.status == "ok", (torch.reason, numpy.reason)
    assert numpy.describe["math_mode"]["computed_in"] == torch.describe["math_mode"]["computed_in"]
    assert numpy.describe["math_mode"]["computed_in"]["dropout1"] == "float32"
    assert abs(numpy.losses[0] - torch.losses[0]) / torch.losses[0] < 1e-4


def test_every_layer_kind_has_its_place_in_a_bf16_run():
    from harness.layers import KINDS

    assert sorted(KINDS) == sorted(autocast.LOWERED + autocast.KEPT + autocast.FLOAT32)


def test_a_transformers_bf16_run_of_the_array_module_code_is_torchs_autocast_run_to_bf16s_rounding():
    """gpl_transformer (embedding, RoPE attention, layer norms, residuals, dropout): each layer's
    output dtype is torch's under autocast on the CPU (the residual sums float32: the
    embedding's float32 output is added), and the first step's loss is torch's to well within
    bfloat16's rounding (attention's fused kernel sums in its own blocks)."""
    runs = _runs(ROOT / "specs" / "gpl_transformer.yaml", "quick")
    torch, numpy = runs["torch"], runs["numpy"]
    assert torch.status == numpy.status == "ok", (torch.reason, numpy.reason)
    assert numpy.describe["math_mode"]["computed_in"] == torch.describe["math_mode"]["computed_in"]
    assert abs(numpy.losses[0] - torch.losses[0]) / torch.losses[0] < 2.0**-12


@pytest.mark.parametrize("mode", ["fast"])
def test_the_array_module_bf16_run_is_eager_only(tmp_path, mode):
    problem = build_problem(load_spec(tiny_moons(tmp_path)))
    outcome = runner.run(problem, RunKey("numpy", "cpu", precision=BF16, mode=mode))
    assert outcome.status == "skipped" and "eager only" in outcome.reason


def test_meta_layout_rope_runs_in_bf16_in_every_framework(tmp_path):
    """RoPE's `interleaved` layout (each pair a complex number) in a bf16 run: torch's
    complex128 turn made q and k float64 beside a bfloat16 v (scaled_dot_product_attention
    raised), and JAX's lax.complex refused bfloat16, until both compute it as Meta's and
    EasyLM's code do, in float32 and back in the input's dtype (a drawn family spec found it).
    Every bf16 run trains, within bfloat16's rounding of the others on the first step."""
    import yaml

    from tests.helpers import write_spec

    doc = yaml.safe_load((ROOT / "specs" / "gpl_transformer.yaml").read_text())
    attention = [layer["layers"][1] for layer in doc["model"]["layers"] if isinstance(layer, dict) and layer.get("kind") == "residual"]
    for a in attention:
        if a.get("kind") == "attention":
            a["rope"]["layout"] = "interleaved"
    problem = build_problem(load_spec(write_spec(tmp_path / "meta_rope.yaml", doc, {}), "quick"))
    runs = {f: runner.run(problem, RunKey(f, "cpu", precision=BF16)) for f in ("torch", "jax", "numpy")}
    assert all(o.status == "ok" for o in runs.values()), {f: o.reason for f, o in runs.items()}
    first = {f: o.losses[0] for f, o in runs.items()}
    assert max(first.values()) - min(first.values()) < 2.0**-9 * first["torch"]
