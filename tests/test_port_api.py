"""harness.check_port and harness.testing.assert_port_matches (issue 53): the one-line errors
(nothing runs), arrays as data (data kind `arrays`, read without unpickling), a port on the
real MNIST test-set files from this process, and the README's example file as a user runs it
(worker processes finding the callables again by file and qualified name)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import traceback
from pathlib import Path

import numpy as np
import pytest

import harness
from harness.core.errors import DataError, SpecError
from harness.inputs import arrays as arrays_mod
from harness.inputs import data as data_mod
from harness.spec.data import ArraysData

ROOT = Path(__file__).resolve().parents[1]


def mnist_arrays(n_train: int, n_val: int):
    """The first rows of the real MNIST test-set files the harness ships, as a user's arrays."""
    images = data_mod.read_idx(data_mod.EMBEDDED_DIR / "t10k-images-idx3-ubyte.gz")
    labels = data_mod.read_idx(data_mod.EMBEDDED_DIR / "t10k-labels-idx1-ubyte.gz").astype(np.int64)
    x = images.reshape(len(images), -1).astype(np.float32) / np.float32(255)
    n = n_train + n_val
    return {"train": (x[:n_train], labels[:n_train]), "validation": (x[n_train:n], labels[n_train:n])}


# A user's port on MNIST, defined at this module's top level under names of its own.
def mnist_torch():
    import torch

    return torch.nn.Sequential(torch.nn.Linear(784, 16), torch.nn.Tanh(), torch.nn.Linear(16, 10))


def mnist_flax():
    import flax.linen as nn

    class Net(nn.Module):
        @nn.compact
        def __call__(self, x, train: bool = False):
            return nn.Dense(10, name="out")(nn.tanh(nn.Dense(16, name="hidden")(x)))

    return Net()


def mnist_convert(state):
    def dense(i):
        return {"kernel": state[f"{i}.weight"].T, "bias": state[f"{i}.bias"]}

    return {"params": {"hidden": dense(0), "out": dense(2)}}


SETUP = dict(
    loss="cross_entropy",
    optimizer={"kind": "sgd", "lr": 0.1, "momentum": 0.9},
    training={"epochs": 1, "batch_size": 64},
    checks={"math_parity": {"steps": 4, "members": 3}},
)


def test_a_port_on_real_mnist_arrays_passes_in_process_and_its_records_name_the_callables(tmp_path):
    pytest.importorskip("torch", reason="torch is not installed")
    pytest.importorskip("flax", reason="flax is not installed")
    verdict = harness.check_port(mnist_torch, mnist_flax, mnist_convert, data=mnist_arrays(1024, 256), results=tmp_path, in_process=True, **SETUP)
    assert verdict.passed, str(verdict)
    assert {r["framework"] for r in verdict.records} >= {"torch", "jax"}
    ported = verdict.records[0]["spec"]["port"]
    source = Path(__file__).resolve()
    assert ported["path"] == str(source) and ported["sha256"] == hashlib.sha256(source.read_bytes()).hexdigest()
    assert ported["functions"] == {"torch_model": "mnist_torch", "flax_model": "mnist_flax", "torch_to_flax": "mnist_convert"}
    written = [json.loads(p.read_text()) for p in tmp_path.rglob("*.json")]
    assert written and all(w["spec"]["port"]["functions"] == ported["functions"] for w in written if "spec" in w)


def moons_torch():
    import torch

    return torch.nn.Sequential(torch.nn.Linear(2, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))


def test_a_data_section_a_loss_section_and_the_default_checks_take_the_same_path(tmp_path):
    """`data` as a spec's data section (moons, made by the harness), `loss` as a section,
    `checks` left to the spec's defaults, the callables under names of their own: it runs,
    passes, and its records say what ran."""
    pytest.importorskip("torch", reason="torch is not installed")
    pytest.importorskip("flax", reason="flax is not installed")
    verdict = harness.check_port(
        moons_torch,
        moons_flax,
        mnist_convert,
        data={"kind": "moons", "n_samples": 512, "noise": 0.2, "seed": 0},
        loss={"kind": "cross_entropy", "reduction": "mean", "label_smoothing": 0.1},
        optimizer={"kind": "adam", "lr": 0.01},
        training={"epochs": 2, "batch_size": 64, "shuffle_seed": 3},
        init_seed=5,
        in_process=True,
    )
    assert verdict.passed, str(verdict)
    spec = verdict.records[0]["spec"]
    assert spec["name"] == "port_moons_torch" and spec["port"]["functions"]["torch_model"] == "moons_torch"


def moons_flax():
    import flax.linen as nn

    class Net(nn.Module):
        @nn.compact
        def __call__(self, x, train: bool = False):
            return nn.Dense(2, name="out")(nn.tanh(nn.Dense(16, name="hidden")(x)))

    return Net()


def test_a_closure_runs_in_process_and_is_refused_for_workers_in_one_line():
    def torch_model():
        return mnist_torch()

    with pytest.raises(SpecError, match=r"^torch_model: .*<locals>.torch_model is defined inside a function: .*in_process=True"):
        harness.check_port(torch_model, mnist_flax, mnist_convert, data=mnist_arrays(64, 16), **SETUP)
    with pytest.raises(SpecError, match=r"^flax_model: .*is a lambda"):
        harness.check_port(mnist_torch, lambda: None, mnist_convert, data=mnist_arrays(64, 16), **SETUP)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (dict(torch_model=3), r"^torch_model: a function \(or class\) that builds the torch.nn.Module, got int"),
        (dict(torch_to_flax=np.transpose), r"^torch_model, flax_model, torch_to_flax: defined in .* and .*: a port's three callables"),
        (dict(data=[1, 2]), r"^data: a spec's data section .* got list"),
        (dict(data={"train": (np.zeros((4, 784)), np.zeros(4, np.int64))}), r"^data.train: features are float32, got float64"),
        (
            dict(data={"train": (np.zeros((4, 784), np.int64), np.zeros(4, np.int64))}),
            r"^data.train: token ids are integers of \(examples, context 784\) for x and y alike: y is int64 of \(4,\)",
        ),
        (dict(data={"train": (np.zeros((4, 1, 8, 8), np.int64), np.zeros(4, np.int64))}), r"^data.train: integer features: features are float32"),
        (dict(data={"train": (-np.ones((4, 8), np.int64), np.zeros((4, 8), np.int64))}), r"^data.train: x's token ids go from -1 to -1"),
        (
            dict(data={"train": (np.zeros((4, 8), np.int64), np.zeros((4, 8), np.int64))}, input_shape=(8,)),
            r"^input_shape: a text's input is its token ids, which the data gives",
        ),
        (dict(data={"train": (np.zeros((4, 784), np.float32), np.zeros(3, np.int64))}), r"^data.train: x has 4 rows, y 3"),
        (dict(data={"train": (np.zeros((4, 784), np.float32), -np.ones(4, np.int64))}), r"^data.train: labels are class indices"),
        (dict(data={"train": (np.full((4, 784), np.nan, np.float32), np.zeros(4, np.int64))}), r"^data.train: x holds NaN"),
        (dict(data={"training": None}), r"^data: arrays as"),
        (dict(data={"kind": "idx"}), r"^input_shape: a 'idx' data section's rows are known once read"),
        (dict(loss=1), r"^loss: a dict of the spec's loss section, got int"),
        (dict(optimizer="sgd"), r"^optimizer: a dict of the spec's optimizer section, got str"),
        (dict(training={"epochs": 1, "batch_size": 64, "epoch": 2}), r"<check_port>: training.epoch: unknown key"),
        (dict(optimizer={"kind": "sgd"}), r"<check_port>: optimizer.lr: missing key"),
        (dict(init_seed="0"), r"^init_seed: an integer, got str"),
        (dict(devices=["tpu"]), r"^devices: unknown 'tpu'"),
        (dict(input_shape=(0,)), r"^input_shape: \(features,\) or"),
    ],
)
def test_bad_arguments_are_one_line_spec_errors_before_anything_runs(change, message):
    arguments = {"torch_model": mnist_torch, "flax_model": mnist_flax, "torch_to_flax": mnist_convert, "data": mnist_arrays(64, 16), **SETUP}
    arguments.update(change)
    with pytest.raises(SpecError, match=message) as caught:
        harness.check_port(**arguments)
    assert "\n" not in str(caught.value) and isinstance(caught.value, ValueError)


def mnist_convert_fc(state):
    """A converter's slip: flax's last layer is `out`, this names it `fc`."""
    converted = mnist_convert(state)
    converted["params"]["fc"] = converted["params"].pop("out")
    return converted


def conv_torch():
    import torch

    return torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 10))


def conv_flax():
    import flax.linen as nn

    class Net(nn.Module):
        @nn.compact
        def __call__(self, x, train: bool = False):
            x = nn.Conv(4, (3, 3), padding="VALID", name="conv")(x)
            return nn.Dense(10, name="fc")(x.transpose(0, 3, 1, 2).reshape(x.shape[0], -1))  # torch's flatten order

    return Net()


def conv_convert(state):
    conv = {"kernel": state["0.weight"].transpose(2, 3, 1, 0), "bias": state["0.bias"]}
    return {"params": {"conv": conv, "fc": {"kernel": state["2.weight"].T, "bias": state["2.bias"]}}}


# Each case: the port (torch_model, flax_model, torch_to_flax), a row's shape, how many label
# values, and the one line it raises.
BAD_DATA = {
    "labels": ((mnist_torch, mnist_flax, mnist_convert), (784,), 15, "the torch module gives 10 outputs; the data's labels go up to 14"),
    "converter": (
        (mnist_torch, mnist_flax, mnist_convert_fc),
        (784,),
        10,
        r"torch_to_flax\(state\) gives \['params'\]\['fc'\]\['bias'\] .* where flax's init has \['params'\]\['out'\]",
    ),
    "channels": (
        (conv_torch, conv_flax, conv_convert),
        (3, 8, 8),
        10,
        "the torch module's forward raised RuntimeError: .* to have 1 channels, but got 3",
    ),
}


@pytest.mark.parametrize("case", list(BAD_DATA))
def test_data_or_a_converter_the_port_cannot_take_is_a_one_line_spec_error_from_the_workers(case):
    """Labels past the module's outputs, a converter naming a layer flax does not have, images
    of 3 channels for a 1-channel conv: each found by the port's own code (the last two in a
    worker process), each a harness.SpecError (a ValueError) of one line with no worker's
    traceback chained to it, before anything trains."""
    pytest.importorskip("torch", reason="torch is not installed")
    pytest.importorskip("flax", reason="flax is not installed")
    callables, row, classes, message = BAD_DATA[case]
    x = np.random.default_rng(0).standard_normal((256, *row)).astype(np.float32)
    training = {"epochs": 1, "batch_size": 16}
    with pytest.raises(harness.SpecError, match=message) as caught:
        harness.check_port(*callables, data={"train": (x, np.arange(256) % classes)}, **{**SETUP, "training": training})
    assert "\n" not in str(caught.value) and isinstance(caught.value, ValueError)
    shown = "".join(traceback.format_exception(caught.value))
    assert shown.count("Traceback (most recent call last)") == 1 and "_RemoteTraceback" not in shown  # nothing chained


def _npz(tmp_path: Path, **arrays) -> ArraysData:
    path = tmp_path / "arrays.npz"
    np.savez(path, **arrays)
    return ArraysData(kind="arrays", file=path.name, sha256=hashlib.sha256(path.read_bytes()).hexdigest())


def test_an_arrays_file_is_read_checked_and_never_unpickled(tmp_path):
    x, y = mnist_arrays(32, 0)["train"]
    split = arrays_mod.load_arrays(_npz(tmp_path, x_train=x, y_train=y.astype(np.uint8)), tmp_path)
    assert split.x_val is None and split.y_train.dtype == np.int64 and np.array_equal(split.x_train, x)
    section = _npz(tmp_path, x_train=np.array([{"a": 1}], dtype=object), y_train=y[:1])
    with pytest.raises(DataError, match="is not a NumPy .npz file of plain arrays"):
        arrays_mod.load_arrays(section, tmp_path)
    section = _npz(tmp_path, x_train=x, y_train=y, x_val=x)
    with pytest.raises(DataError, match="x_val and y_val both or neither"):
        arrays_mod.load_arrays(section, tmp_path)
    with pytest.raises(DataError, match="data.sha256: checksum mismatch"):
        arrays_mod.load_arrays(section.model_copy(update={"sha256": "0" * 64}), tmp_path)
    with pytest.raises(DataError, match="data.file: .*missing"):
        arrays_mod.load_arrays(section.model_copy(update={"file": "none.npz"}), tmp_path)


def test_an_arrays_file_of_token_ids_gives_the_model_its_context_and_vocabulary(tmp_path):
    """Data kind arrays with `tokens` (check_port's token-id arrays): the model's input is the
    ids, (examples, context) for x and y alike, each id below the vocabulary."""
    from harness.spec.load import load_mapping

    ids = np.arange(40, dtype=np.int64).reshape(5, 8) % 7
    section = _npz(tmp_path, x_train=ids, y_train=np.roll(ids, -1, axis=1)).model_dump()
    document = {
        "name": "token_arrays", "title": "t", "article": "a", "model": {"python": "port.py"}, "init": {"seed": 0},
        "loss": {"kind": "cross_entropy", "reduction": "mean"}, "optimizer": {"kind": "sgd", "lr": 0.1},
        "training": {"epochs": 1, "batch_size": 5, "shuffle": False, "shuffle_seed": 0, "last_batch": "keep"},
        "logging": {"loss_every": 1, "print_every": 10}, "timing": {"repeats": 1},
        "data": {**section, "tokens": {"context": 8, "vocabulary": 7}},
    }  # fmt: skip
    (tmp_path / "port.py").write_text("")
    spec = load_mapping(document, "full", folder=tmp_path).spec
    assert (spec.model.tokens.context, spec.model.tokens.vocabulary) == (8, 7) and spec.model.in_shape == (8,)
    split = arrays_mod.load_arrays(spec.data, tmp_path)
    assert split.x_train.dtype == np.int64 and np.array_equal(split.x_train, ids) and split.example_shape == (8,)
    with pytest.raises(DataError, match=r"x's token ids go from 0 to 6, outside 0 to 5 \(the vocabulary\)"):
        arrays_mod.load_arrays(spec.data.model_copy(update={"tokens": spec.data.tokens.model_copy(update={"vocabulary": 6})}), tmp_path)
    short = {**_npz(tmp_path, x_train=ids, y_train=ids[:, 1:]).model_dump(), "tokens": {"context": 8, "vocabulary": 7}}
    with pytest.raises(DataError, match=r"for x and y alike: y is int64 of \(5, 7\)"):
        arrays_mod.load_arrays(ArraysData(**short), tmp_path)


@pytest.mark.slow
def test_the_readme_example_file_passes_its_honest_port_and_diagnoses_its_slip_in_worker_processes():
    """examples/test_port_example.py as a user runs it: pytest imports it by path, and each
    job's worker finds the callables again by their file and qualified name."""
    pytest.importorskip("torch", reason="torch is not installed")
    pytest.importorskip("flax", reason="flax is not installed")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "examples/test_port_example.py"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "2 passed" in done.stdout


def test_the_readme_holds_the_example_file_whole():
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## From Python and pytest") :]
    block = section[section.index("```python\n") + len("```python\n") :]
    assert block[: block.index("```\n")] == (ROOT / "examples" / "test_port_example.py").read_text()


PORT_FILE_TEXT = """
import flax.linen as nn
import torch


def torch_model():
    return torch.nn.Sequential(torch.nn.Linear(784, 16), torch.nn.Tanh(), torch.nn.Linear(16, 10))


class Net(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool = False):
        return nn.Dense(10, name="out")(nn.tanh(nn.Dense(16, name="hidden")(x)))


def flax_model():
    return Net()


def torch_to_flax(state):
    hidden = {"kernel": state["0.weight"].T, "bias": state["0.bias"]}
    return {"params": {"hidden": hidden, "out": {"kernel": state["2.weight"].T, "bias": state["2.bias"]}}}
"""


def test_check_port_gives_the_records_of_the_same_port_run_from_a_yaml_file_bitwise(tmp_path):
    """One port, its file beside a YAML spec and run as `harness run` runs it, and the same
    file's functions handed to check_port: the same checks (errors, ratios, diagnoses), the
    same inputs and the same loss curves, bitwise, record for record."""
    import importlib.util

    pytest.importorskip("torch", reason="torch is not installed")
    pytest.importorskip("flax", reason="flax is not installed")
    from harness import arguments
    from harness.api import run_loaded
    from harness.options import RunOptions
    from harness.records.store import read_record
    from harness.spec.load import load_spec

    (tmp_path / "my_port.py").write_text(PORT_FILE_TEXT)
    found = importlib.util.spec_from_file_location("my_port", tmp_path / "my_port.py")
    mine = importlib.util.module_from_spec(found)
    found.loader.exec_module(mine)
    arrays = mnist_arrays(1024, 256)
    (tmp_path / "data").mkdir()
    npz = tmp_path / "data" / "arrays.npz"
    np.savez(npz, x_train=arrays["train"][0], y_train=arrays["train"][1], x_val=arrays["validation"][0], y_val=arrays["validation"][1])
    document = {
        "name": "port_torch_model",
        "title": "a port checked from Python: my_port.py",  # check_port's own: the same spec, the same inputs' hash
        "article": "harness.check_port",
        "data": {"kind": "arrays", "file": "arrays.npz", "sha256": hashlib.sha256(npz.read_bytes()).hexdigest()},
        "model": {"python": "my_port.py", "input_width": 784},
        "init": {"seed": 0},
        "loss": {"kind": "cross_entropy", "reduction": "mean"},
        "optimizer": SETUP["optimizer"],
        "training": {**SETUP["training"], "shuffle": True, "shuffle_seed": 0, "last_batch": "keep"},
        "logging": {"loss_every": 1, "print_every": 1000},
        "timing": {"repeats": 1},
        "checks": SETUP["checks"],
    }
    (tmp_path / "my_port.yaml").write_text(json.dumps(document))  # JSON is YAML
    yaml_dir, api_dir = tmp_path / "yaml", tmp_path / "api"
    argv = ["--in-process", "--frameworks", "torch,jax", "--data-dir", str(tmp_path / "data"), "--results", str(yaml_dir)]
    options = RunOptions.from_args(arguments.parser("harness").parse_args(["run", *argv]))  # as `harness run` parses them
    from_file = run_loaded(load_spec(tmp_path / "my_port.yaml"), options)
    from_python = harness.check_port(mine.torch_model, mine.flax_model, mine.torch_to_flax, data=arrays, results=api_dir, in_process=True, **SETUP)
    assert from_file.passed and from_python.passed, str(from_python)
    read = [{(r.framework, r.precision_mode): r for r in map(read_record, (d / "port_torch_model").glob("*.json"))} for d in (yaml_dir, api_dir)]
    assert read[0].keys() == read[1].keys() and len(read[0]) == 4
    for key, ours in read[0].items():
        theirs = read[1][key]
        assert ours.model_dump(mode="json")["checks"] == theirs.model_dump(mode="json")["checks"], key
        assert ours.data.inputs_sha256 == theirs.data.inputs_sha256 and ours.spec.port.sha256 == theirs.spec.port.sha256, key
        curves = [np.load(d / "port_torch_model" / r.artifacts.file, allow_pickle=False)["losses"] for d, r in ((yaml_dir, ours), (api_dir, theirs))]
        assert np.array_equal(curves[0], curves[1]), key


@pytest.mark.slow
def test_checks_under_held_processes_give_the_same_checks_in_the_same_processes(tmp_path):
    """harness.held_processes (harness.testing's harness_processes in pytest): a second
    check_port of the README's example port runs in the processes the first started (a
    framework's run too, each framework in its own), and its checks are the first's, bitwise
    (errors, ratios), as are those of a check in fresh processes (one writing records)."""
    pytest.importorskip("torch", reason="torch is not installed")
    pytest.importorskip("flax", reason="flax is not installed")
    import importlib.util

    found = importlib.util.spec_from_file_location("test_port_example", ROOT / "examples" / "test_port_example.py")
    example = importlib.util.module_from_spec(found)
    found.loader.exec_module(example)
    sys.modules.setdefault("test_port_example", example)

    def checks(verdict):
        return sorted((c.name, c.a.label, c.b.label, c.verdict.value, c.ratio, c.max_rel_error) for r in verdict.results for c in r.checks)

    fresh = harness.check_port(example.torch_model, example.flax_model, example.torch_to_flax, **example.SETUP, results=tmp_path)
    with harness.held_processes() as held:
        first = harness.check_port(example.torch_model, example.flax_model, example.torch_to_flax, **example.SETUP)
        started = {group: pool for (_, group), pool in held.pools.items()}
        second = harness.check_port(example.torch_model, example.flax_model, example.torch_to_flax, **example.SETUP)
        assert {group: pool for (_, group), pool in held.pools.items()} == started
    assert {("held", "torch"), ("held", "jax")} <= set(started), sorted(started)
    assert fresh.passed and checks(first) == checks(second) == checks(fresh)
    assert not held.pools  # ended with it


@pytest.mark.slow
def test_token_id_arrays_give_the_checks_of_the_text_data_section_they_were_cut_from():
    """A text port (examples/text_port) checked on token-id arrays, x and y of (examples,
    context), the next token at each position: the text data section's own examples and
    split (harness.inputs.data.load_text), so its checks are the section's, bitwise."""
    pytest.importorskip("torch", reason="torch is not installed")
    pytest.importorskip("flax", reason="flax is not installed")
    import importlib.util

    from harness.spec.load import load_spec

    found = importlib.util.spec_from_file_location("text_port", ROOT / "examples" / "text_port" / "text_port.py")
    port = importlib.util.module_from_spec(found)
    found.loader.exec_module(port)
    spec = load_spec(ROOT / "examples" / "text_port" / "text_port.yaml").spec
    split = data_mod.load_text(spec.data, data_mod.SYSTEM_TEXTS)
    training = {"epochs": 1, "batch_size": 32, "last_batch": "drop"}
    common = dict(loss="cross_entropy", optimizer=spec.optimizer.model_dump(exclude_none=True), training=training)
    arrays = {"train": (split.x_train, split.y_train), "validation": (split.x_val, split.y_val)}

    def checks(verdict):
        return sorted((c.name, c.a.label, c.b.label, c.verdict.value, c.ratio, c.max_rel_error) for r in verdict.results for c in r.checks)

    with harness.held_processes():
        from_arrays = harness.check_port(port.torch_model, port.flax_model, port.torch_to_flax, data=arrays, **common)
        section = spec.data.model_dump(exclude_none=True)
        from_section = harness.check_port(port.torch_model, port.flax_model, port.torch_to_flax, data=section, **common)
    assert from_arrays.passed and not from_arrays.failures, from_arrays
    assert checks(from_arrays) == checks(from_section) and len(checks(from_arrays)) > 20
