"""The generated family of workloads (tests/family.py): honest adapters show no failing
check on any example, and every injected bug is diagnosed `implementation`.

`nox -s tests` runs a few examples; `nox -s family` runs many (HARNESS_FAMILY_EXAMPLES) and
writes one JSON line per example to HARNESS_FAMILY_OUT for `python -m tests.family`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from tests import family

EXAMPLES = int(os.environ.get("HARNESS_FAMILY_EXAMPLES", "4"))
OUT = os.environ.get("HARNESS_FAMILY_OUT")
# Examples are derandomized (the same ones every run) unless a seed picks another set.
SEED = os.environ.get("HARNESS_FAMILY_SEED")

pytest.importorskip("torch")
pytest.importorskip("jax")


@seed(int(SEED or 0))
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=SEED is None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.data())
def test_honest_adapters_never_fail_and_every_injected_bug_is_implementation(data):
    doc = data.draw(family.spec_documents(), label="spec")
    bug = data.draw(st.sampled_from(family.bugs_for(doc)), label="bug")
    start = time.perf_counter()
    result = family.run_example(doc, bug)
    verdict = family.judge(result, bug)
    if OUT:
        with open(OUT, "a") as f:
            row = {
                "spec": doc,
                "verdict": dataclasses.asdict(verdict),
                "seconds": time.perf_counter() - start,
                "clipped_updates": family.clipped_updates(doc),
            }
            f.write(json.dumps(row) + "\n")
    assert {f"{f}@cpu" for f in family.REAL} <= set(verdict.ran), verdict.ran
    assert not verdict.honest_failures, verdict.honest_failures
    if verdict.bug_inert:  # it changed no bit: there is nothing to catch (counted in the summary)
        return
    assert verdict.bug_caught, f"{bug}: math parity did not see it"
    assert all(d.startswith("implementation") for d in verdict.bug_diagnoses), verdict.bug_diagnoses
    if verdict.bug_layer_named is not None:  # a porting bug of a layer kind: its layer is named
        assert verdict.bug_layer_named, (verdict.bug_layers, verdict.bug_diagnoses)
