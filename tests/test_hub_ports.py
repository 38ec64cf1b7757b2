"""Ports as hubs ship them (issue 83): modules whose outputs are tuples with Nones,
dataclasses or ModelOutputs, tied weights, flax modules that take their computation's
dtype, submodules in lists that each library names its own way, outputs that differ only by
broadcasting; and Hugging Face transformers' own GPT-2 and ResNet (examples/hub_gpt2,
examples/hub_resnet), honest and with the slips users make, where transformers 4.x is
installed (`pip install -e '.[hub]'`; skipped, saying so, where it is not)."""

from __future__ import annotations

import collections
import dataclasses
import importlib.util
import re
from pathlib import Path

import numpy as np
import pytest

from harness.core.registry import PORT_REFERENCE_KEY, CheckVerdict
from harness.inputs import port
from harness.inputs.problem import build_problem
from harness.spec.load import load_spec
from tests.conftest import ROOT
from tests.test_port import copied, counted, failing, harness, judged

HUB_PORT = ROOT / "tests" / "hub_port"
EXAMPLES = ROOT / "examples"


def test_a_modules_output_is_its_first_array_however_it_is_packed():
    a, b = np.zeros(2), np.ones(3)

    @dataclasses.dataclass
    class Output:
        extra: object
        hidden: object

    assert port.first_array(a) is a
    assert port.first_array((None, (a, b))) is a
    assert port.first_array(collections.OrderedDict(logits=a, hidden=b)) is a  # as HF's ModelOutput keeps its fields
    assert port.first_array(Output(extra=None, hidden=b)) is b
    assert port.first_array((None, {"x": None})) is None and port.first_array("text") is None


def test_outputs_equal_after_broadcasting_are_equal_and_a_shape_alone_names_no_module():
    from harness.verdict.parity import first_layer_apart

    rng = np.random.default_rng(0)
    pos, fc = rng.normal(size=(1, 3)), rng.normal(size=(4, 3))
    reference = {"pos": pos, "odd": np.zeros((2, 5)), "fc": fc}
    assert first_layer_apart({"pos": np.repeat(pos, 4, axis=0), "odd": np.zeros((3, 7)), "fc": fc}, reference, shared_only=True) is None
    named = first_layer_apart({"pos": np.repeat(pos, 4, axis=0), "fc": fc + 1e-3}, reference, shared_only=True)
    assert named == "fc, after odd, which only the reference names", named
    paired = first_layer_apart({"pos": pos, port.paired("fc", "dense_0"): fc + 1e-3}, {"pos": pos, "fc": fc}, shared_only=True)
    assert paired == "fc (flax's dense_0)", paired


@pytest.mark.parametrize(
    "converter, said",
    [
        (lambda s: {"params": {"x": s["a"], "y": s["c"], "z": s["b"]}}, r"places a 2 times \(tied: c is the same tensor"),
        (lambda s: {"params": {"x": s["a"]}}, "leaves out b"),
        (lambda s: {"params": {"x": s["a"], "z": s["b"][:2]}}, "places only part of b"),
        (lambda s: {"params": {"x": s["a"] + 0.5, "z": s["b"]}}, r"gives flax's \['params'\]\['x'\] values that are not torch's moved"),
    ],
    ids=["tied_twice", "left_out", "part", "changed"],
)
def test_a_converter_that_drops_duplicates_or_changes_a_tensor_is_named(converter, said):
    """Where each torch value lands: a tied tensor (c is a) lands once under either name; one
    placed twice, left out, cut or changed is named in one line."""
    from adapters import jax_port

    shapes, tied = (("a", (2,)), ("b", (3,))), (("c", "a"),)
    assert jax_port._index_map(Path("p.py"), lambda s: {"params": {"x": s["c"], "z": s["b"]}}, shapes, tied)[1].tolist() == [0, 1, 2, 3, 4]
    with pytest.raises(port.PortError, match=said):
        jax_port._index_map(Path("p.py"), converter, shapes, tied)


def test_tied_torch_tensors_are_one_parameter():
    import torch

    lin = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 3))
    lin[1].weight = lin[0].weight
    state = lin.state_dict()
    assert port.tied(state) == {"1.weight": "0.weight"} and list(port.untied(state)) == ["0.weight", "0.bias", "1.bias"]


def test_torchs_attention_dropout_is_turned_off_as_the_others_are():
    import torch

    from adapters.torch_port import _no_dropout

    q = torch.randn(2, 4, 8)
    with _no_dropout(torch):
        dropped = torch.nn.functional.scaled_dot_product_attention(q, q, q, None, 0.5)
        keyword = torch.nn.functional.scaled_dot_product_attention(q, q, q, dropout_p=0.5)
    plain = torch.nn.functional.scaled_dot_product_attention(q, q, q)
    assert torch.equal(dropped, plain) and torch.equal(keyword, plain)


def test_a_hub_style_ports_forward_passes_agree_and_its_modules_pair_through_the_converter():
    """The hub-style port (tests/hub_port): tuples with Nones and a dataclass captured, the
    tied weight one parameter, flax's list-named blocks paired with torch's through the
    converter, the broadcast offset equal; flax's float64 pass within 1e-13 of torch's."""
    from harness.run import port_start
    from harness.verdict import parity

    loaded = load_spec(HUB_PORT / "hub_port.yaml")
    problem = build_problem(loaded)
    assert problem.port_tied == (("tied.weight", "mix.weight"),) and "tied.weight" not in problem.initial_params
    outputs = port_start.check_start(problem, loaded.port_sha256)
    check = parity.initial_forward_check(port_start.FLAX_TWIN_KEY, PORT_REFERENCE_KEY, outputs)
    assert check.verdict == CheckVerdict.PASS and check.max_rel_error < 1e-13, check
    twin = outputs[port_start.FLAX_TWIN_KEY.label]
    assert {"body/blocks/0 (flax's body/blocks_0)", "body/blocks/1/layer/0 (flax's body/blocks_1/layer_0)", "body"} <= set(twin), sorted(twin)
    assert parity.first_layer_apart(twin, outputs[PORT_REFERENCE_KEY.label], shared_only=True) is None


def test_a_slip_in_a_list_named_block_names_the_module_on_both_sides(tmp_path):
    result = judged(copied(HUB_PORT, tmp_path, "return x + jnp.tanh(self.layer[0](x)), None", "return x - jnp.tanh(self.layer[0](x)), None"))
    found = failing(result, "math_initial_forward")
    assert "first differs at module body/blocks/0 (flax's body/blocks_0)" in found.diagnosis and "offset" not in found.diagnosis, found.diagnosis


def test_a_flax_module_computing_float32_in_the_float64_twin_stops_in_one_line(tmp_path):
    """A flax module that pins its computation's dtype (HF's default float32) would make the
    twin a float32 run, read as different math: one line with the mend, exit 2, nothing trained."""
    path = copied(
        HUB_PORT, tmp_path, "def flax_model(dtype=jnp.float32):\n    return FlaxHub(dtype=dtype)", "def flax_model():\n    return FlaxHub()"
    )
    done = harness("run", str(path), "--frameworks", "torch,jax", "--no-records", "--no-floor")
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    said = "flax's module body/inp computes in float32 inside the float64 twin; give flax_model a `dtype` keyword"
    assert len(lines) == 1 and said in lines[0], done.stderr
    assert "train " not in done.stdout, done.stdout


@pytest.mark.slow
def test_an_honest_hub_style_port_passes_every_check():
    result = judged(HUB_PORT / "hub_port.yaml")
    assert not [c for c in result.checks if c.verdict == CheckVerdict.FAIL], [c for c in result.checks if c.verdict == CheckVerdict.FAIL]
    assert all(o.status == "ok" for o in result.outcomes.values()), result.outcomes


def test_check_port_takes_a_text_data_section(tmp_path):
    """A text port through the Python API: the data section gives the token ids (no
    input_shape); a slip in its forward pass fails before anything trains, naming the module."""
    import harness

    path = copied(EXAMPLES / "text_port", tmp_path, 'nn.LayerNorm(epsilon=1e-5, name="norm1")', 'nn.LayerNorm(name="norm1")')
    spec = importlib.util.spec_from_file_location("text_port_slip", path.with_suffix(".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    data = load_spec(EXAMPLES / "text_port" / "text_port.yaml").spec.data.model_dump(exclude_none=True)
    setup = {"data": data, "loss": "cross_entropy", "optimizer": {"kind": "adam", "lr": 0.003}}
    with pytest.raises(harness.SpecError, match="a text's input is its token ids"):
        harness.check_port(module.torch_model, module.flax_model, module.torch_to_flax, **setup, training={"epochs": 1}, input_shape=(32,))
    training = {"epochs": 1, "batch_size": 32, "last_batch": "drop"}
    verdict = harness.check_port(module.torch_model, module.flax_model, module.torch_to_flax, **setup, training=training)
    assert not verdict.passed and any(f.check == "math_initial_forward" and f.module == "norm1" for f in verdict.failures), verdict


# --- Hugging Face transformers' own models ---------------------------------------------------


def judged_on(path: Path, data_dir: Path | None):
    """A port's matrix in this process, its data found in `data_dir` (judged's)."""
    import io

    from rich.console import Console

    from harness.execute.plan import matrix_keys
    from harness.matrix import run_cells

    loaded = load_spec(path)
    return run_cells(loaded, build_problem(loaded, data_dir), matrix_keys(["torch", "jax"], ["cpu"]), None, Console(file=io.StringIO(), width=300))


def _transformers():
    return pytest.importorskip("transformers", reason="transformers 4.x (the extra `hub`) is not installed: the hub examples need it")


HUB_SLIPS = [
    ("hub_gpt2", "FLAX_CONFIG = GPT2Config(**CONFIG)", "FLAX_CONFIG = GPT2Config(**CONFIG, layer_norm_epsilon=1e-6)", "gpt2/transformer/h/0/ln_1"),
    (
        "hub_gpt2",
        "FLAX_CONFIG = GPT2Config(**CONFIG)",
        'FLAX_CONFIG = GPT2Config(**CONFIG, activation_function="gelu")',
        "gpt2/transformer/h/0/mlp/c_proj, after gpt2/transformer/h/0/mlp/act",
    ),
    (
        "hub_gpt2",
        "TORCH_CONFIG = GPT2Config(**CONFIG)",
        'TORCH_CONFIG = GPT2Config(**CONFIG, scale_attn_weights=False, attn_implementation="eager")',
        "gpt2/transformer/h/0/attn/c_proj",
    ),
    (
        "hub_resnet",
        "return resnet(images, deterministic=not train).logits",
        "return resnet(images).logits",
        "resnet/resnet/embedder/embedder/normalization",
    ),
    (
        "hub_resnet",
        "FLAX_CONFIG = ResNetConfig(**CONFIG)",
        'FLAX_CONFIG = ResNetConfig(**CONFIG, hidden_act="gelu")',
        "resnet/resnet/embedder/embedder, after",
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize("example, old, new, named", HUB_SLIPS, ids=["gpt2_eps", "gpt2_gelu", "gpt2_unscaled", "resnet_running_stats", "resnet_act"])
def test_each_slip_in_a_hub_model_is_caught_with_the_module_named(tmp_path, mnist_dir, example, old, new, named):
    _transformers()
    result = judged_on(copied(EXAMPLES / example, tmp_path, old, new), mnist_dir)
    found = failing(result, "math_initial_forward")
    assert found.diagnosis.startswith("implementation:") and f"first differs at module {named}" in found.diagnosis, found.diagnosis


@pytest.mark.slow
@pytest.mark.parametrize("example", ["hub_gpt2", "hub_resnet"])
def test_hf_gpt2_and_resnet_pass_as_users_write_them(mnist_dir, example):
    """HF's own modules and names on each side, natural position ids, flax_model(dtype=...),
    no apply override: no check fails (optax's float32 bias corrections and flax's fast
    variances `known`)."""
    _transformers()
    result = judged_on(EXAMPLES / example / f"{example}.yaml", mnist_dir)
    assert not [c for c in result.checks if c.verdict == CheckVerdict.FAIL], [c for c in result.checks if c.verdict == CheckVerdict.FAIL]
    assert all(o.status == "ok" for o in result.outcomes.values()) and counted(result.checks).get("pass", 0) > 20, counted(result.checks)
    assert re.search(r"known", str(counted(result.checks))), counted(result.checks)


def _callables(example: str):
    """The example port's module, imported as a user's test file imports it."""
    found = importlib.util.spec_from_file_location(example, EXAMPLES / example / f"{example}.py")
    module = importlib.util.module_from_spec(found)
    found.loader.exec_module(module)
    return module.torch_model, module.flax_model, module.torch_to_flax


@pytest.mark.slow
@pytest.mark.parametrize("example", ["hub_gpt2", "hub_resnet"])
def test_hf_gpt2_and_resnet_pass_through_check_port(mnist_dir, example):
    """The same models from Python: harness.check_port with the example's data section."""
    import harness

    _transformers()
    spec = load_spec(EXAMPLES / example / f"{example}.yaml").spec
    data = spec.data.model_dump(exclude_none=True)
    shape = {} if example == "hub_gpt2" else {"input_shape": (1, 28, 28), "data_dir": mnist_dir}
    training = {"epochs": 1, "batch_size": spec.training.batch_size, "last_batch": spec.training.last_batch}
    optimizer = spec.optimizer.model_dump(exclude_none=True)
    checks = {} if example == "hub_gpt2" else {"checks": spec.checks.model_dump(exclude_none=True)}
    verdict = harness.check_port(*_callables(example), data=data, loss="cross_entropy", optimizer=optimizer, training=training, **shape, **checks)
    assert verdict.passed and not verdict.failures, verdict
