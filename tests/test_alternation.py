"""Eager and fast modes of one framework and device take turns repeat by repeat (harness
bench), so a drift in the machine's speed falls on both and their ratio holds."""

from __future__ import annotations

import numpy as np

from harness.core.paths import SPECS_DIR
from harness.core.registry import CALIBRATION_KEY, ORACLE_KEY, RunKey
from harness.execute import capacity, executors, jobs, plan
from harness.inputs.problem import build_problem
from harness.run import runner
from harness.spec.load import load_spec
from tests.conftest import quick_problem

EAGER = CALIBRATION_KEY  # numpy@cpu
FAST = RunKey("numpy", "cpu", mode="fast")


def test_keys_differing_only_in_mode_are_grouped_in_order():
    torch_eager, torch_fast = RunKey("torch", "cpu"), RunKey("torch", "cpu", mode="fast")
    gpu = RunKey("torch", "gpu")
    keys = [torch_eager, EAGER, gpu, torch_fast, FAST, ORACLE_KEY]  # EAGER is the calibration run
    assert plan.alternation_groups(keys) == [[torch_eager, torch_fast], [EAGER, FAST], [gpu], [ORACLE_KEY]]
    assert plan.alternation_groups(plan.matrix_keys(["jax"], ["cpu"])) == [[RunKey("jax", "cpu")], [EAGER], [ORACLE_KEY]]


def test_repeats_take_turns_and_train_as_if_alone(monkeypatch):
    problem = quick_problem("peaks_mlp")
    order = []
    original = runner._Trial.repeat

    def logged(trial, repeat):
        order.append((trial.key, repeat))
        original(trial, repeat)

    monkeypatch.setattr(runner._Trial, "repeat", logged)
    together = runner.run_alternating(problem, [EAGER, FAST], repeats=3)
    assert order == [(EAGER, 0), (FAST, 0), (EAGER, 1), (FAST, 1), (EAGER, 2), (FAST, 2)]
    for key, other in ((EAGER, FAST), (FAST, EAGER)):
        outcome = together[key]
        assert outcome.status == "ok", outcome.reason
        assert outcome.timings["repeats"] == 3 and len(outcome.timings["train_s_each"]) == 3
        assert outcome.timings["alternated_with"] == [other.label]
        assert outcome.repeats_bitwise_identical
        alone = runner.run(problem, key)
        assert np.array_equal(outcome.losses, alone.losses)
        assert "alternated_with" not in alone.timings


def test_a_mode_that_fails_leaves_the_other_running(monkeypatch):
    problem = quick_problem("peaks_mlp")
    original = runner._Trial.repeat

    def breaks_fast(trial, repeat):
        if trial.key == FAST and repeat == 1:
            raise MemoryError("out of memory in the second repeat")
        original(trial, repeat)

    monkeypatch.setattr(runner._Trial, "repeat", breaks_fast)
    outcomes = runner.run_alternating(problem, [EAGER, FAST], repeats=3)
    assert outcomes[FAST].status == "failed" and "out of memory" in outcomes[FAST].reason
    assert outcomes[EAGER].status == "ok" and outcomes[EAGER].timings["repeats"] == 3


def test_the_matrix_runs_a_group_in_one_fresh_process():
    """One cell holds the modes of one framework and device: a worker runs them together."""
    loaded = load_spec(SPECS_DIR / "peaks_mlp.yaml", "quick")
    problem = build_problem(loaded)
    cell = jobs.Job("numpy@cpu", jobs.FRAMEWORK, ((EAGER, "eager"), (FAST, "fast")), repeats=2)
    local = executors.Local(capacity.Slots(capacity.LOCAL, 1, None))
    try:
        finished = local.submit(cell, jobs.run_job, jobs.source_of(loaded, problem), cell, None, True).result()
    finally:
        local.shutdown()
    assert list(finished.outcomes) == [EAGER, FAST]
    assert all(o.status == "ok" and o.timings["alternated_with"] for o in finished.outcomes.values())
    assert finished.host["hostname"]
