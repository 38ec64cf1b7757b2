"""The spec language's reference (docs/spec-reference.md): generated from the models, so it
names every required key, every layer kind and every optimizer kind with its defaults, and
`harness schema --check` fails when the committed file is stale. The defaults a spec may
leave out are the ones torch and optax share."""

from __future__ import annotations

import inspect

import pytest

from harness.layers import KINDS as LAYER_KINDS
from harness.optimizers import KINDS as OPTIMIZER_KINDS
from harness.optimizers.adam import Adam
from harness.optimizers.adamw import AdamW
from harness.spec import load, reference
from harness.spec.model import Spec
from tests.helpers import harness


def test_the_committed_reference_is_the_generated_one():
    assert reference.REFERENCE_FILE.read_text() == reference.markdown(load.json_schema())


def test_the_reference_names_every_required_key_kind_and_default():
    text = reference.markdown(load.json_schema())
    required = [name for name, field in Spec.model_fields.items() if field.is_required()]
    assert {"title", "article", "logging", "timing"} <= set(required)
    assert "Required: " + ", ".join(f"`{k}`" for k in required) + "." in text
    for kind, module in LAYER_KINDS.items():
        assert f"## model.layers[] (kind: {kind})" in text
        for key, field in module.Section.model_fields.items():
            said = "**required**" if field.is_required() else f"`{field.default}`".lower().replace("none", "null")
            if isinstance(field.default, str):
                said = f'`"{field.default}"`'
            assert f"| `{key}` | {said} |" in text.split(f"(kind: {kind})", 1)[1], (kind, key)
    for kind in OPTIMIZER_KINDS:
        assert f"## optimizer (kind: {kind})" in text
    section = text.split("## optimizer (kind: adam)", 1)[1].split("## ", 1)[0]
    assert "| `beta1` | `0.9` |" in section and "| `eps` | `1e-08` |" in section and "| `lr` | **required** |" in section


def test_schema_check_fails_on_a_stale_reference(tmp_path, capsys, monkeypatch):
    stale = tmp_path / "spec-reference.md"
    stale.write_text(reference.markdown(load.json_schema()).replace("| `lr` | **required** |", "| `lr` | `0.1` |", 1))
    monkeypatch.setattr(reference, "REFERENCE_FILE", stale)
    code, out, _ = harness(capsys, "schema", "--check")
    assert code == 1 and str(stale) in out


def _defaults(function, *names: str) -> list:
    parameters = inspect.signature(function).parameters
    return [parameters[n].default for n in names]


@pytest.mark.parametrize("section", [Adam, AdamW])
def test_adams_defaults_are_the_ones_torch_and_optax_share(section):
    torch = pytest.importorskip("torch")
    optax = pytest.importorskip("optax")
    torch_class, optax_fn = {Adam: (torch.optim.Adam, optax.adam), AdamW: (torch.optim.AdamW, optax.adamw)}[section]
    (betas, torch_eps) = _defaults(torch_class.__init__, "betas", "eps")
    b1, b2, optax_eps = _defaults(optax_fn, "b1", "b2", "eps")
    assert (tuple(betas), torch_eps) == ((b1, b2), optax_eps)
    fields = section.model_fields
    assert (fields["beta1"].default, fields["beta2"].default, fields["eps"].default) == (b1, b2, optax_eps)
    if section is AdamW:  # the two libraries' weight decays differ: a spec must give it
        assert fields["weight_decay"].is_required()
        assert _defaults(torch_class.__init__, "weight_decay") != _defaults(optax_fn, "weight_decay")


def test_a_spec_may_leave_out_adams_shared_defaults(tmp_path):
    import yaml

    doc = yaml.safe_load((load.SPECS_DIR / "mnist_adamw.yaml").read_text())
    given = load.load_spec(load.SPECS_DIR / "mnist_adamw.yaml").spec
    for key in ("beta1", "beta2", "eps"):
        doc["optimizer"].pop(key)
    path = tmp_path / "short.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert load.load_spec(path).spec.optimizer == given.optimizer
