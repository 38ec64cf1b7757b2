"""Library defects (harness/library_defects.yaml): the evidence for each, the adapter's
measurement of it (adapters/jax_defects.py), and the diagnosis that names it on the
checks it fails (harness/verdict/defects.py)."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import numpy as np
import pytest
import yaml
from rich.console import Console

from harness.core.errors import SpecError
from harness.core.registry import CheckVerdict, RunKey
from harness.execute.plan import matrix_keys
from harness.inputs.problem import build_problem
from harness.run.runner import Outcome
from harness.spec import catalogue
from harness.spec.load import load_spec
from harness.verdict import defects
from harness.verdict.checks import Check
from harness.verdict.diagnosis import FLOAT32_ROUNDING

CROP = "xla-cpu-conv-negative-low-padding"


EVIDENCE = """
import numpy as np, jax, jax.numpy as jnp, flax.linen as nn
jax.config.update("jax_enable_x64", True)

def apart(module, x):  # the float32 input gradient of sum(module(x)^2) against float64's
    variables = module.init(jax.random.PRNGKey(0), jnp.asarray(x))
    grads = {}
    for dtype in (jnp.float64, jnp.float32):
        cast = jax.tree.map(lambda a: jnp.asarray(a, dtype), variables)
        grad = jax.jit(jax.grad(lambda inputs: jnp.sum(module.apply(cast, inputs) ** 2)))
        grads[dtype] = np.asarray(grad(jnp.asarray(x, dtype)), dtype=np.float64)
    return float(np.abs(grads[jnp.float32] - grads[jnp.float64]).max() / np.abs(grads[jnp.float64]).max())

rng = np.random.default_rng(0)
x = rng.standard_normal((16, 9, 12, 2))
padded = nn.Sequential([lambda h: jnp.pad(h, ((0, 0), (2, 0), (1, 1), (0, 0))), nn.Conv(2, (2, 2), padding="VALID")])
print(apart(nn.Conv(2, (2, 2), padding=((2, 0), (1, 1))), x), apart(padded, x),
      apart(nn.Conv(20, (2, 2), padding=((2, 0), (1, 1))), rng.standard_normal((16, 9, 12, 20))))
"""


def test_xla_cpu_gets_a_float32_convolution_padded_beyond_its_kernel_wrong_and_the_mend_right():
    """The catalogued evidence, in a fresh process as a user's script runs it: a 2x2
    convolution padded by 2 above (its backward pass crops, a negative low padding) gives a
    float32 input gradient far from float64's on 2 channels; padded by jnp.pad before a
    VALID convolution, or on 20 channels (another kernel), it is float32 rounding. (Inside
    a process that has run other XLA programs the wrong read can land on the right values:
    seen once, in the suite; the adapter measures it in the run's own process.) Fails once
    jaxlib is mended: update the entry then."""
    pytest.importorskip("flax")
    done = subprocess.run([sys.executable, "-c", EVIDENCE], capture_output=True, text=True, timeout=300, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert done.returncode == 0, done.stderr[-2000:]
    cropped, mended, wide = map(float, done.stdout.split())
    assert cropped > 1e-2 and mended < 1e-5 and wide < 1e-5, (cropped, mended, wide)


def test_the_probe_measures_the_cropping_convolution_and_nothing_else():
    """adapters/jax_defects.py finds the backward pass of the convolution padded beyond its
    kernel, names its module, and finds nothing in a step whose convolutions pad within it."""
    jax = pytest.importorskip("jax")
    pytest.importorskip("flax")
    import flax.linen as nn
    import jax.numpy as jnp

    from adapters import jax_defects

    class Two(nn.Module):
        padding: tuple

        @nn.compact
        def __call__(self, x):
            x = nn.tanh(nn.Conv(2, (2, 2), padding="VALID", name="first")(x))
            return nn.Conv(2, (2, 2), padding=self.padding, name="second")(x)

    x = jnp.asarray(np.random.default_rng(1).standard_normal((8, 8, 9, 1)), jnp.float32)
    device = jax.devices("cpu")[0]
    found = {}
    for padding in (((2, 0), (1, 1)), ((1, 1), (1, 1))):
        net = Two(padding)
        params = net.init(jax.random.PRNGKey(0), x)
        step = jax.jit(jax.grad(lambda p, x, net=net: jnp.sum(net.apply(p, x) ** 2)))
        found[padding] = jax_defects.measured(step, (params, x), {}, device)
    (crop,) = found[((2, 0), (1, 1))]
    assert crop["defect"] == CROP and crop["op"] == "second's backward pass" and crop["padding"][0][0] < 0
    assert crop["error"] > jax_defects.WRONG
    assert found[((1, 1), (1, 1))] == []


def _check(a: RunKey, b: RunKey, diagnosis: str, verdict=CheckVerdict.FAIL) -> Check:
    return Check("params_after_step_1", a, b, verdict, "calibrated", diagnosis=diagnosis)


def test_a_check_put_down_to_rounding_leads_with_the_defect_its_run_measured():
    """Only a failing check whose diagnosis is float32 rounding, with a side that measured a
    defect, is diagnosed with it (the upstream issue and the mend named); a check diagnosed
    `implementation` keeps its diagnosis, and a passing one stays as it is."""
    jax32, torch32, torch64 = RunKey("jax", "cpu"), RunKey("torch", "cpu"), RunKey("torch", "cpu", precision="float64")
    measured = {"defect": CROP, "op": "conv2's backward pass", "padding": [[-1, 1], [0, 0]], "error": 3.4e6}
    outcomes = {jax32: Outcome(jax32, "ok", describe={"defects": [measured]}), torch32: Outcome(torch32, "ok")}
    rounding = f"{FLOAT32_ROUNDING}, 1e+04x the calibrated tolerance; the float64 twins agree"
    checks = [
        _check(torch32, jax32, rounding),
        _check(jax32, torch64, "implementation: the float64 twin of jax@cpu differs"),
        _check(torch32, torch64, rounding),
        _check(torch32, jax32, None, CheckVerdict.PASS),
    ]
    named = defects.named(checks, outcomes, FLOAT32_ROUNDING)
    said = named[0].diagnosis
    assert said.startswith(f"{defects.DEFECT}: {CROP}, measured in jax@cpu's float32 step (conv2's backward pass: 3.4e+06 off")
    assert "https://github.com/openxla/xla/issues/48713" in said and "mend: pad with jnp.pad" in said
    assert said.endswith("float32 only, 1e+04x the calibrated tolerance; the float64 twins agree")
    assert [c.diagnosis for c in named[1:]] == [c.diagnosis for c in checks[1:]]


def test_the_defects_catalogue_is_validated_and_a_bad_entry_named(tmp_path):
    entry = catalogue.library_defects()[CROP]
    assert entry.framework == "jax" and entry.devices == ["cpu"] and "48713" in entry.upstream
    doc = yaml.safe_load(catalogue.LIBRARY_DEFECTS_FILE.read_text())
    doc[0]["upstream"] = "file:///etc/passwd"
    (tmp_path / "defects.yaml").write_text(yaml.safe_dump(doc))
    with pytest.raises(SpecError, match=r"defects\.yaml: not a valid library-defects file: 0\.upstream: String should match") as refused:
        catalogue.library_defects(tmp_path / "defects.yaml")
    assert "\n" not in str(refused.value)


SPEC = """
name: conv_crop
title: a generated workload whose second convolution pads beyond its kernel
article: tests/family.py (port seed 20261211, draw 53)
data: {kind: image_patterns, n_samples: 166, shape: [1, 7, 12], classes: 2, noise: 1.0, seed: 61}
model:
  input_shape: [1, 7, 12]
  layers:
    - {kind: conv2d, filters: 2, kernel: 2, stride: 1, padding: [[2, 1], [1, 0]], activation: gelu_tanh}
    - {kind: batch_norm, momentum: 0.1, eps: 0.001, running_var: unbiased}
    - {kind: conv2d, filters: 2, kernel: 2, stride: 1, padding: [[2, 0], [1, 1]], activation: identity}
    - {kind: flatten}
    - {width: 8, activation: gelu}
    - {width: 2}
init: {weights: normal_over_sqrt_fan_in, biases: zeros, seed: 324}
loss: {kind: cross_entropy, reduction: sum}
optimizer: {kind: sgd, lr: 6.024096385542169e-05}
training: {epochs: 3, batch_size: full, shuffle: false, shuffle_seed: 9, last_batch: drop}
logging: {loss_every: 1, print_every: 1000}
checks: {params_after_steps: {step: 2}}
timing: {repeats: 1}
"""


def test_a_run_that_meets_the_defect_fails_saying_so_not_rounding(tmp_path):
    """Port seed 20261211's draw 53 as a spec: JAX's float32 run measures the defect in its
    second convolution's backward pass; every check it fails leads with the defect (its
    gradients are wrong where the float64 twins agree), none is put down to rounding or to
    different math, and JAX's float64 twin passes math parity."""
    pytest.importorskip("flax")
    from harness.matrix import run_cells

    (tmp_path / "conv_crop.yaml").write_text(SPEC)
    loaded = load_spec(tmp_path / "conv_crop.yaml")
    result = run_cells(loaded, build_problem(loaded), matrix_keys(["torch", "jax"], ["cpu"]), None, Console(file=io.StringIO()))
    jax32 = RunKey("jax", "cpu")
    (measured,) = result.outcomes[jax32].describe["defects"]
    assert measured["defect"] == CROP and measured["op"].endswith("conv2's backward pass")
    failing = [c for c in result.checks if c.verdict == CheckVerdict.FAIL]
    assert all(c.involves(jax32) and c.diagnosis.startswith(f"{defects.DEFECT}: {CROP}") for c in failing), [c.diagnosis for c in failing]
    twin = [c for c in result.checks if c.name.startswith("math_") and c.involves(RunKey("jax", "cpu", precision="float64"))]
    assert twin and all(c.verdict == CheckVerdict.PASS for c in twin)
