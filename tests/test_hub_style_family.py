"""The port family written in a hub's style (issue 83; tests/port_family.py HUB,
tests/text_ports.py `hub`): the layers kept in lists (torch's `layers.0.layer`, flax's
`layers_0/layer`), each in a block returning a tuple with a None, every flax module computing
in the dtype flax_model is given, and a text's head tied to its token embedding as GPT-2's
is. An honest one's initial forward passes agree far within float32's rounding; each classic
slip fails before anything trains, both sides' modules named; the hub style's own slips (a
module pinned to float32, the tie dropped) stop in one line naming the module or tensor.
tools/port_family.py and tools/forward_family.py (`hub`) measure it over the family."""

from __future__ import annotations

import pytest

import harness
from harness.core.registry import CheckVerdict
from tests.test_text_port_family import _forward

pytest.importorskip("torch")
pytest.importorskip("flax")

SEED = 20261207  # tools/forward_family.py's fresh seed for the hub style (docs/measurements.md)
IMAGE_DRAW = 21  # conv, batch norm, conv, flatten, dense: four of the classic slips and a pinned dtype
TEXT_DRAW = 0
DRAWN = 60  # of the seed, as the tool drew them (hypothesis draws otherwise for another count)


@pytest.fixture(scope="module")
def image_doc():
    from tests import port_family

    return port_family.drawn(DRAWN, SEED, ("image",))[IMAGE_DRAW]


@pytest.fixture(scope="module")
def text_doc():
    from tests import port_family

    return port_family.drawn(DRAWN, SEED, ("text",))[TEXT_DRAW]


def test_a_hub_style_image_port_is_written_as_hubs_write_theirs_and_its_forward_passes_agree(tmp_path, image_doc):
    from tests import port_family

    path, _ = port_family.port_of(image_doc, tmp_path, hub=True)
    source = path.with_name("port.py").read_text()
    hub_style = ("torch.nn.ModuleList([", "return self.layer(x), None", "FlaxBlock(functools.partial(nn.Conv", "def flax_model(dtype=")
    for written in hub_style:
        assert written in source, written
    check = _forward(path)
    assert check.verdict == CheckVerdict.PASS and check.max_rel_error < 1e-12, check


def test_each_slip_in_a_hub_style_port_fails_before_training_with_both_sides_named(tmp_path, image_doc):
    from tests import port_family

    seen = []
    for slip in ("batch_norm_eps", "gelu_approximation", "flatten_order"):
        folder = tmp_path / slip
        folder.mkdir()
        path, written = port_family.port_of(image_doc, folder, slip, hub=True)
        check = _forward(path)
        assert check.verdict == CheckVerdict.FAIL, (slip, check)
        layer = written.named.removeprefix("module ")
        # torch's path, and flax's beside it: "layers/1/layer (flax's layers_1/layer)"
        flax_side = f"(flax's {layer.replace('/', '_')}/"
        assert check.forward_layer.startswith(f"{layer}/") and flax_side in check.forward_layer, (slip, check.forward_layer)
        seen.append(slip)
    assert len(seen) == 3


def test_a_flax_module_pinned_to_float32_stops_the_hub_port_in_one_line_naming_it(tmp_path, image_doc):
    from tests import port_family

    path, written = port_family.port_of(image_doc, tmp_path, "dtype_pinned", hub=True)
    assert written.named == "module layers/0"
    with pytest.raises(harness.SpecError, match=r"flax's module layers_0/layer computes in float32 inside the float64 twin") as caught:
        _forward(path)
    assert "\n" not in str(caught.value)


def test_a_text_port_with_its_head_tied_to_the_embedding_agrees_and_its_dropped_tie_is_named(tmp_path, text_doc):
    from tests import port_family

    honest, slipped = tmp_path / "honest", tmp_path / "tie_dropped"
    honest.mkdir()
    slipped.mkdir()
    path, _ = port_family.port_of(text_doc, honest, hub=True)
    source = path.with_name("port.py").read_text()
    assert ".weight = self.embed" in source and ".attend(x)" in source, source
    check = _forward(path)
    assert check.verdict == CheckVerdict.PASS and check.max_rel_error < 1e-12, check
    path, written = port_family.port_of(text_doc, slipped, "tie_dropped", hub=True)
    with pytest.raises(harness.SpecError, match=rf"places {written.named} 2 times \(tied: ") as caught:
        _forward(path)
    assert "\n" not in str(caught.value)


@pytest.mark.slow
def test_an_honest_tied_text_port_trains_with_no_failing_check(tmp_path, text_doc):
    """Both frameworks sum the tied tensor's two gradients (its embedding's rows and the
    head's), so the tie trains alike: every run finishes and no check fails."""
    from tests import port_family
    from tests.test_port import counted, judged

    result = judged(port_family.port_of(text_doc, tmp_path, hub=True)[0])
    assert all(o.status == "ok" for o in result.outcomes.values()), [(k.label, o.reason) for k, o in result.outcomes.items()]
    failing = [(c.name, c.a.label, c.diagnosis) for c in result.checks if c.verdict == CheckVerdict.FAIL]
    assert result.checks and counted(result.checks)["fail"] == 0, failing
