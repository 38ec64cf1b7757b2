"""Spec loading and validation: the shipped specs load; bad documents are rejected with
an error naming the file and the key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from harness.core.errors import SpecError
from harness.core.paths import SPECS_DIR
from harness.spec.load import json_schema, load_spec, resolve_spec, spec_paths, sweep_overrides
from harness.spec.model import total_steps

PEAKS = SPECS_DIR / "peaks_mlp.yaml"


def peaks_doc() -> dict:
    return yaml.safe_load(PEAKS.read_text())


def write(tmp_path: Path, doc) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc))
    return path


@pytest.mark.parametrize("name", ["peaks_mlp", "moons_net", "mnist_mlp"])
def test_shipped_specs_load_with_every_profile(name):
    loaded = load_spec(SPECS_DIR / f"{name}.yaml")
    assert loaded.name == name and loaded.profile == "full" and len(loaded.sha256) == 64
    for profile in loaded.spec.profiles:
        assert load_spec(loaded.path, profile).profile == profile


def test_specs_follow_their_articles():
    peaks = load_spec(PEAKS).spec
    assert peaks.data.points_per_axis == 200 and peaks.training.epochs == 2000
    assert peaks.training.batch_size == "full"
    assert [(layer.width, layer.activation) for layer in peaks.model.layers] == [(20, "relu"), (5, "relu"), (1, "identity")]
    assert (peaks.optimizer.kind, peaks.optimizer.lr, peaks.optimizer.eps) == ("adam", 0.08, 1e-8)
    moons = load_spec(SPECS_DIR / "moons_net.yaml").spec
    assert (moons.data.n_samples, moons.data.noise, moons.training.epochs) == (5000, 0.2, 20000)
    assert moons.loss.l2.coefficient == 0.01 and moons.loss.l2.divide_by_examples
    assert (moons.optimizer.kind, moons.optimizer.lr) == ("sgd", 0.01)
    mnist = load_spec(SPECS_DIR / "mnist_mlp.yaml").spec
    assert [layer.width for layer in mnist.model.layers] == [32, 10] and mnist.training.batch_size == 128
    assert mnist.data.sources["train-set"].validation == 10000
    assert total_steps(mnist.training, 50000) == 10 * 391  # the partial last batch is a step


def test_profile_shrinks_and_is_recorded():
    quick = load_spec(PEAKS, "quick")
    assert quick.spec.training.epochs == 100 and quick.spec.data.points_per_axis == 50
    assert quick.overrides == {"data": {"points_per_axis": 50}, "training": {"epochs": 100}}


@pytest.mark.parametrize(
    "mutate, key, message",
    [
        (lambda d: d.update(colour="blue"), "colour", "unknown key"),
        (lambda d: d["optimizer"].update(momentum=0.9), "optimizer.momentum", "unknown key"),
        (lambda d: d.pop("loss"), "loss", "missing key"),
        (lambda d: d["training"].pop("epochs"), "training.epochs", "missing key"),
        (lambda d: d["training"].update(epochs="many"), "training.epochs", "integer"),
        (lambda d: d["training"].update(epochs=-3), "training.epochs", "greater than 0"),
        (lambda d: d["optimizer"].update(lr=0), "optimizer.lr", "greater than 0"),
        (lambda d: d["optimizer"].update(lr=-0.1), "optimizer.lr", "greater than 0"),
        (lambda d: d["model"]["layers"][0].update(width=0), "model.layers.0.width", "greater than 0"),
        (lambda d: d["model"]["layers"][0].update(activation="sigmoid"), "model.layers.0.activation", "relu"),
        (lambda d: d["optimizer"].update(beta1=1.0), "optimizer.beta1", "less than 1"),
        (lambda d: d["data"].update(kind="spiral"), "data", "peaks_grid"),
        (lambda d: d["profiles"].update(quick={"training": {"epochs": 0}}), "profiles.quick.training.epochs", "greater than 0"),
    ],
)
def test_bad_specs_name_the_file_and_key(tmp_path, mutate, key, message):
    doc = peaks_doc()
    mutate(doc)
    path = write(tmp_path, doc)
    with pytest.raises(SpecError) as info:
        load_spec(path)
    text = str(info.value)
    assert f"{path}: {key}" in text and message in text


def test_batch_larger_than_data_with_drop_rule_is_rejected(tmp_path):
    doc = peaks_doc()
    doc["training"].update(batch_size=50000, last_batch="drop")
    with pytest.raises(SpecError, match=r"training.batch_size: 50000 is larger than the 40000"):
        load_spec(write(tmp_path, doc))
    doc["training"]["last_batch"] = "keep"  # one partial batch: a rule, so accepted
    assert load_spec(write(tmp_path, doc)).spec.training.batch_size == 50000


@pytest.mark.parametrize("text", ["a: [1, 2", "- just\n- a list\n", "42", ""])
def test_non_mapping_or_broken_yaml(tmp_path, text):
    with pytest.raises(SpecError, match=str(tmp_path)):
        load_spec(write(tmp_path, text))


def test_yaml_tags_are_not_executed(tmp_path):
    path = write(tmp_path, "name: !!python/object/apply:os.system ['echo hacked']\n")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_spec(path)


def test_file_names_cannot_escape_the_data_folder(tmp_path):
    doc = yaml.safe_load((SPECS_DIR / "mnist_mlp.yaml").read_text())
    doc["data"]["sources"]["test-set"]["images"]["file"] = "../../etc/passwd"
    with pytest.raises(SpecError, match=r"data.sources.test-set.images.file"):
        load_spec(write(tmp_path, doc))


def test_unknown_profile_and_spec_names():
    with pytest.raises(SpecError, match="profile 'huge' is not defined"):
        load_spec(PEAKS, "huge")
    with pytest.raises(SpecError, match="unknown spec 'nope'"):
        resolve_spec("nope")
    assert set(spec_paths()) == {"peaks_mlp", "moons_net", "mnist_mlp", "lenet_mnist", "cnn_norm_mnist", "mnist_adamw", "gpl_transformer"}


def test_committed_schema_is_current():
    assert (SPECS_DIR / "schema.json").read_text() == json_schema()


def test_the_peaks_sweep_spans_100_to_160000_points():
    spec = load_spec(PEAKS).spec
    sizes = [value**2 for value in spec.sweep.values]
    assert sizes[0] == 100 and sizes[-1] == 160_000 and sizes == sorted(sizes)
    point = load_spec(PEAKS, spec.sweep.profile, sweep_overrides(spec)[-1])
    assert point.spec.data.n_examples == 160_000 and point.profile == "sweep"
    assert point.overrides == {"training": {"epochs": 100}, "data": {"points_per_axis": 400}}


@pytest.mark.parametrize(
    "sweep, message",
    [
        ({"key": "data.points_per_axis", "values": [10], "profile": "nope"}, "sweep.profile: 'nope' is not a profile"),
        ({"key": "data.n_samples", "values": [10], "profile": "quick"}, "sweep.key: peaks_grid data has no data.n_samples"),
        ({"key": "data.points_per_axis", "values": [], "profile": "quick"}, "sweep.values"),
        ({"key": "data.points_per_axis", "values": [0], "profile": "quick"}, "sweep.values.0"),
    ],
)
def test_a_bad_sweep_names_its_key(tmp_path, sweep, message):
    doc = peaks_doc()
    doc["sweep"] = sweep
    with pytest.raises(SpecError, match=message.replace(".", r"\.").replace("(", r"\(")):
        load_spec(write(tmp_path, doc))


def test_a_sweep_point_that_breaks_the_spec_names_the_point(tmp_path):
    doc = peaks_doc()
    path = write(tmp_path, doc)
    spec = load_spec(path).spec
    with pytest.raises(SpecError, match="sweep point .*points_per_axis"):
        load_spec(path, "sweep", {"data": {"points_per_axis": 1}})
    assert spec.claims.gpu_speedup.low == 200


def test_a_claim_range_must_be_ordered(tmp_path):
    doc = peaks_doc()
    doc["claims"] = {"gpu_speedup": {"low": 40, "high": 5, "source": "somewhere"}}
    with pytest.raises(SpecError, match="claims.gpu_speedup.*high: smaller than low"):
        load_spec(write(tmp_path, doc))


@pytest.mark.parametrize(
    "where, key",
    [
        ("model", "model.layers.2: conv2d: a window of 50"),
        ("profile", "profiles.quick.model.layers.2: conv2d: a window of 5 does not fit an image of 4x4"),
        ("input", "model: give input_width (a vector) or input_shape (an image), one of them"),
    ],
)
def test_a_model_error_names_its_key_path_once(tmp_path, where, key):
    """A rule of the model section that names a deeper key (a layer that does not fit) says
    that key once: not `model: model.layers.2: ...`."""
    doc = yaml.safe_load((SPECS_DIR / "lenet_mnist.yaml").read_text())
    if where == "model":
        doc["model"]["layers"][2]["kernel"] = 50
    elif where == "profile":
        doc["profiles"]["quick"]["model"] = {"input_shape": [1, 8, 8]}
    else:
        doc["model"]["input_width"] = 784
    with pytest.raises(SpecError) as refused:
        load_spec(write(tmp_path, doc))
    message = str(refused.value)
    assert "\n" not in message and message.startswith(f"{tmp_path / 'spec.yaml'}: {key}"), message
