"""The generated transformers written as ports (tests/text_ports.py): torch's
nn.MultiheadAttention or F.scaled_dot_product_attention against flax's
MultiHeadDotProductAttention or nn.dot_product_attention, RoPE, dropout, residuals, on the
bytes of Debian's licences. An honest port's two initial forward passes agree far within
float32's rounding; each classic slip fails before anything trains, the module named.
tools/port_family.py and tools/forward_family.py (`text`) measure it over the family."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from harness.core.registry import PORT_REFERENCE_KEY, CheckVerdict
from harness.inputs.problem import build_problem
from harness.spec.load import load_spec
from tests.conftest import ROOT

pytest.importorskip("torch")
pytest.importorskip("flax")

SEED = 20261401  # draws 5, 6 and 9 of it take every slip between them (tools/forward_family.py)
DRAWS = (5, 6, 9)


def _forward(path):
    from harness.run import port_start
    from harness.verdict import parity

    loaded = load_spec(path)
    outputs = port_start.check_start(build_problem(loaded), loaded.port_sha256)
    return parity.initial_forward_check(port_start.FLAX_TWIN_KEY, PORT_REFERENCE_KEY, outputs)


@pytest.fixture(scope="module")
def docs():
    from tests import port_family

    drawn = port_family.drawn(max(DRAWS) + 1, SEED, ("text",))
    return [drawn[i] for i in DRAWS]


def test_the_drawn_text_ports_write_attention_each_way_each_library_offers(docs):
    from tests import text_ports

    ported = "\n".join(text_ports.text_port_source(doc)[0].split("class TorchPort")[1] for doc in docs)  # below the shared helpers
    drawn = [text_ports.styles(doc) for doc in docs]
    assert {t for t, _ in drawn} == {"mha", "sdpa"} and {f for _, f in drawn} == {"mhdpa", "dpa"}, drawn
    forms = ("nn.MultiheadAttention(", "TorchAttention(", "nn.MultiHeadDotProductAttention(", "FlaxAttention(", "torch.nn.Dropout(", "nn.Dropout(")
    for written in forms:
        assert written in ported, written
    assert "('half', " in ported or "('interleaved', " in ported  # RoPE, turned on both sides


def test_honest_text_ports_initial_forward_passes_agree_far_within_float32s_rounding(tmp_path, docs):
    from tests import port_family

    for i, doc in enumerate(docs):
        folder = tmp_path / str(i)
        folder.mkdir()
        check = _forward(port_family.port_of(doc, folder)[0])
        assert check.verdict == CheckVerdict.PASS and check.max_rel_error < 1e-12, (DRAWS[i], check)


@pytest.mark.slow
def test_each_text_slip_fails_before_training_with_its_module_named(tmp_path, docs):
    """q and k swapped unpacking in_proj_weight, the causal mask forgotten, the heads split
    in the wrong order, RoPE's other layout, flax's layer-norm eps, GELU's other form:
    each written into the first layer that takes it, in one of the draws."""
    from tests import port_family, text_ports

    seen, missed = set(), []
    for i, doc in enumerate(docs):
        for slip in text_ports.TEXT_SLIPS:
            folder = tmp_path / f"{i}-{slip}"
            folder.mkdir()
            path, written = port_family.port_of(doc, folder, slip)
            if written is None:
                continue
            seen.add(slip)
            check = _forward(path)
            named = check.verdict == CheckVerdict.FAIL and any(f"{written.named}{end}" in f"module {check.forward_layer} " for end in " ,/")
            if not named:
                missed.append((DRAWS[i], slip, written, check.verdict, check.forward_layer))
    assert seen == set(text_ports.TEXT_SLIPS) and not missed, (seen, missed)


@pytest.mark.slow
def test_an_honest_drawn_text_port_with_rope_passes_every_check_trained(tmp_path, docs):
    """Draw 9 (RoPE turned by each side from the same tables, four Linears with
    F.scaled_dot_product_attention against four Denses with nn.dot_product_attention),
    trained: no check fails, every run finishes."""
    from tests import port_family
    from tests.test_port import counted, judged

    doc = docs[DRAWS.index(9)]
    assert any(layer.get("rope") for layer in doc["model"]["layers"])
    result = judged(port_family.port_of(doc, tmp_path)[0])
    counts = counted(result.checks)
    failing = [(c.name, c.a.label, c.b.label, c.diagnosis) for c in result.checks if c.verdict == CheckVerdict.FAIL]
    assert counts["fail"] == 0 and counts["pass"] >= 20, failing
    assert all(o.status == "ok" for o in result.outcomes.values())


@pytest.mark.slow
def test_a_catalogued_formula_that_diverges_reads_known_and_every_run_diverging_is_said(tmp_path):
    """Text seed 20261608, draw 8: SGD at lr 1.0 with dampening diverges in every run, JAX's
    first (optax's SGD has no dampening: larger steps). Its twin diverges where torch's
    reference computing optax's formula does: `known`, naming the entry, not different math."""
    out = tmp_path / "draw8.jsonl"
    command = [sys.executable, str(ROOT / "tools" / "port_family.py"), "60", "20261608", "8", "9", str(out), "text"]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    row = json.loads(out.read_text().splitlines()[-1])
    assert row["counts"]["fail"] == 0 and "optax-sgd-no-dampening" in row["known"], row
    assert all("diverged" in reason for reason in row["reasons"].values()) and len(row["reasons"]) == 4, row
    spec = tmp_path / "draw8-ports" / "20261608-8" / "honest" / "generated_port.yaml"
    done = subprocess.run(
        [sys.executable, "-m", "harness", "run", str(spec), "--frameworks", "torch,jax", "--no-records", "--no-floor"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=900,
    )
    said = " ".join(done.stdout.split())
    assert said.index("EVERY RUN DIVERGED generated_port at steps 16 to 88") < said.index("KNOWN generated_port jax@cpu+float64"), said[-3000:]
    assert "math_divergence" in said and "known (optax-sgd-no-dampening" in said, said[-3000:]
