"""The generated family of workloads (tests/family.py): honest adapters show no failing
check on any example, and every injected bug is diagnosed `implementation`.

`nox -s tests` runs a few examples; `nox -s family` runs many (HARNESS_FAMILY_EXAMPLES) and
writes one JSON line per example to HARNESS_FAMILY_OUT for `python -m tests.family`.
"""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from tests import family

EXAMPLES = int(os.environ.get("HARNESS_FAMILY_EXAMPLES", "4"))
OUT = os.environ.get("HARNESS_FAMILY_OUT")
# Examples are derandomized (the same ones every run) unless a seed picks another set.
SEED = os.environ.get("HARNESS_FAMILY_SEED")
# Where the examples run (harness/run/executors.py): in this process (the default), `local`
# (fresh processes, HARNESS_FAMILY_JOBS at once) or `ray` / `ray:ADDRESS` (a cluster).
EXECUTOR = os.environ.get("HARNESS_FAMILY_EXECUTOR", "in-process")
JOBS = int(os.environ["HARNESS_FAMILY_JOBS"]) if os.environ.get("HARNESS_FAMILY_JOBS") else None

pytest.importorskip("torch")
pytest.importorskip("jax")


def draw_examples(count: int) -> list[tuple[dict, str]]:
    """The family's examples, a spec and a bug each, drawn by Hypothesis and nothing run."""
    found = []

    @seed(int(SEED or 0))
    @settings(
        max_examples=count,
        deadline=None,
        derandomize=SEED is None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(st.data())
    def draw(data):
        doc = data.draw(family.spec_documents(), label="spec")
        found.append((doc, data.draw(st.sampled_from(family.bugs_for(doc)), label="bug")))

    draw()
    return found


def test_honest_adapters_never_fail_and_every_injected_bug_is_implementation():
    from harness.run import executors

    executor = executors.make(EXECUTOR, JOBS)
    try:
        futures = [executor.submit(None, family.run_row, doc, bug) for doc, bug in draw_examples(EXAMPLES)]
        rows = [future.result() for future in futures]
    finally:
        executor.shutdown()
    if OUT:
        with open(OUT, "a") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)
    problems = [problem for row in rows for problem in judged(row)]
    assert not problems, problems


def judged(row: dict) -> list[str]:
    """What is wrong with one example's verdict (nothing, for a good harness)."""
    verdict, bug = family.Verdict(**row["verdict"]), row["bug"]
    if not {f"{f}@cpu" for f in family.REAL} <= set(verdict.ran):
        return [f"{bug}: not every framework ran: {verdict.ran}"]
    if verdict.honest_failures:
        return [f"{bug}: honest failures {verdict.honest_failures}"]
    if verdict.bug_inert:  # it changed no bit: there is nothing to catch (counted in the summary)
        return []
    if not verdict.bug_caught:
        return [f"{bug}: math parity did not see it"]
    if not all(d.startswith("implementation") for d in verdict.bug_diagnoses):
        return [f"{bug}: diagnosed {verdict.bug_diagnoses}"]
    if verdict.bug_layer_named is False:  # a porting bug of a layer kind: its layer is named
        return [f"{bug}: its layer is not named ({verdict.bug_layers}, {verdict.bug_diagnoses})"]
    return []
