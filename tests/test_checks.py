"""The checks themselves: the envelope's calibration, known differences, divergence,
and isolated runs."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from harness import matrix
from harness.core.registry import CALIBRATION_KEY, FLOAT64, ORACLE_KEY, PORT_REFERENCE_KEY, RunKey
from harness.execute import plan
from harness.execute.fresh import in_fresh_process
from harness.inputs.members import in_plain_order, reordered
from harness.run import runner
from harness.spec import catalogue
from harness.spec.known import KnownDifference
from harness.spec.model import Close
from harness.verdict import checks, diagnosis
from tests.conftest import problem_or_skip, quick_problem

TORCH = RunKey("torch", "cpu")


@pytest.mark.parametrize("name", ["peaks_mlp", "mnist_mlp"])  # full batch in order; shuffled mini-batches
def test_reordered_is_the_same_training_summed_in_another_order(name):
    """A calibration member: in float64 it trains like the plain problem (the same losses
    and probe outputs up to float64 rounding), while in float32 its rounding differs."""
    problem = problem_or_skip(name)
    moved = reordered(problem, seed=1)
    last_bias = f"{problem.spec.model.placed[-1].name}.bias"
    assert not np.array_equal(moved.initial_params["dense1.weight"], problem.initial_params["dense1.weight"])
    assert np.array_equal(moved.initial_params[last_bias], problem.initial_params[last_bias])  # output units stay
    assert np.array_equal(moved.probe, problem.probe)
    if problem.batch_order is None:
        assert not np.array_equal(moved.x_train, problem.x_train)
    else:  # each batch holds the same examples, in another order
        assert not np.array_equal(moved.batch_order, problem.batch_order)
        for start, stop in problem.bounds:
            assert np.array_equal(np.sort(moved.batch_order[:, start:stop]), np.sort(problem.batch_order[:, start:stop]))
    curve, outputs = {}, {}
    for key in (ORACLE_KEY, CALIBRATION_KEY):
        plain, member = (runner.run(p, key) for p in (problem, moved))
        curve[key.dtype] = np.maximum.accumulate(checks.relative_curve_distance(member.losses, plain.losses))
        outputs[key.dtype] = float(np.abs(member.final_outputs - plain.final_outputs).max())
    # float64: the same training, to its rounding over the first steps; after them a chaotic
    # workload (peaks) carries any rounding up at its own rate, which the BLAS kernels set
    # (1.05e-9 relative in the final outputs on Haswell kernels, 2.4e-10 on SkylakeX). So the
    # rule for the whole run is relative to float32's, which grows at the same rate: float64
    # stays within 1e-6 of float32's distance at every step (measured 1.3e-8 at most, on
    # SkylakeX, Haswell and Sandybridge kernels; eps64 / eps32 is 1.9e-9), or within float64's
    # own rounding of the first steps (1e-14) where float32's rounding happened to land on
    # the plain run's loss (mnist_mlp's step 2: 0 in float32, 2e-16 in float64).
    assert curve["float64"][20] < 1e-14
    assert np.all(curve["float64"] <= np.maximum(1e-6 * curve["float32"], 1e-14)) and outputs["float64"] <= 1e-6 * outputs["float32"]
    assert curve["float32"][-1] > 1e-8  # float32: another rounding
    assert np.array_equal(reordered(problem, seed=1).initial_params["dense1.weight"], moved.initial_params["dense1.weight"])
    restored = in_plain_order(moved.initial_params, moved.unit_orders)
    assert list(restored) == list(problem.initial_params)
    assert all(np.array_equal(restored[name], a) for name, a in problem.initial_params.items())


def test_close_check_with_different_shapes_fails_instead_of_raising():
    tol = Close(rtol=1e-5, atol=1e-6)
    check = checks.close_check("initial_outputs", TORCH, ORACLE_KEY, np.zeros(256), np.zeros(255), tol)
    assert check.verdict == "fail" and "shapes differ" in check.reason


JAX_CPU = RunKey("jax", "cpu")


def fake_check(verdict: str, name: str = "loss_curve_envelope", key: RunKey = JAX_CPU, ratio: float = 3.0) -> checks.Check:
    return checks.Check(name, key, ORACLE_KEY, verdict, "rule", ratio=ratio)


REACHED = {"jax": {"loss_curve_envelope": 0.5, "initial_loss": 0.5}, "torch": {"loss_curve_envelope": 1.0}}  # the library members' ratios


ADAM = quick_problem("peaks_mlp").spec  # Adam, mse
SGD_CROSS_ENTROPY = quick_problem("moons_net").spec  # sgd, cross_entropy


def test_optax_bias_corrections_are_a_library_difference_of_every_adam_spec():
    """The library file covers JAX's float32 checks on any Adam spec, as far as the members
    computing optax's bias corrections reach (10 x 0.5 here), never its float64 twin (math
    parity) and never an SGD spec; the entry is non-strict."""
    marked = diagnosis.apply_known_differences(ADAM, [fake_check("fail"), fake_check("fail", "initial_loss")], REACHED)
    assert [c.verdict for c in marked] == ["known", "fail"]
    assert marked[0].reason.startswith("known difference: optax.adam") and "optax-adam" in marked[0].diagnosis
    assert "0.6 of what it explains" in marked[0].diagnosis
    assert [c.verdict for c in diagnosis.apply_known_differences(ADAM, [fake_check("pass")], REACHED)] == ["pass"]
    twin = fake_check("fail", "math_loss_curve", RunKey("jax", "cpu", precision=FLOAT64))
    assert [c.verdict for c in diagnosis.apply_known_differences(ADAM, [twin], REACHED)] == ["fail"]
    assert [c.verdict for c in diagnosis.apply_known_differences(SGD_CROSS_ENTROPY, [fake_check("fail")], REACHED)] == ["fail"]


def test_only_a_check_non_strict_library_entries_explain_goes_without_the_rest_of_the_envelope():
    """diagnosis.library_known: a float32 check that optax's (non-strict) entry marks known
    against the oracle needs no more of the envelope's members (harness/matrix.py); not one
    that fails, nor a float64 twin's, nor one a spec's own entry or a strict one also covers
    (a strict entry that stops failing is a failure: every member must judge it). On a
    port's scheme too, whose reference is torch's float64 run (measured on fresh port
    seeds, docs/measurements.md 2026-12-07)."""
    known = diagnosis.apply_known_differences(ADAM, [fake_check("fail")], REACHED)[0]
    assert known.verdict == "known" and diagnosis.library_known(ADAM, known)
    assert not diagnosis.library_known(ADAM, fake_check("fail"))
    assert diagnosis.library_known(ADAM, known, PORT_REFERENCE_KEY)
    twin = dataclasses.replace(known, a=RunKey("jax", "cpu", precision=FLOAT64))
    assert not diagnosis.library_known(ADAM, twin)
    for strict in (True, False):
        own = KnownDifference(framework="jax", check="loss_curve_envelope", strict=strict, reason="the spec's own entry for this check")
        spec = ADAM.model_copy(update={"known_differences": [own]})
        assert not diagnosis.library_known(spec, known)
    strict = [e.model_copy(update={"strict": True}) for e in catalogue.library_differences()]
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(catalogue, "library_differences", lambda: strict)
        assert not diagnosis.library_known(ADAM, known)


def test_a_check_known_by_several_library_entries_names_every_one():
    """The float32 members standing for a library compute every entry of it that applies at
    once (catalogue.library_behaviour), so a check within their reach is explained by all of
    them together: its diagnosis and reason name each, not the first alone."""
    cnn = quick_problem("cnn_norm_mnist").spec  # Adam and a batch norm
    port_like = cnn.model_copy(update={"model": cnn.model.model_copy(update={"port_options": ["batch_norm.variance=fast"]})})
    marked = diagnosis.apply_known_differences(port_like, [fake_check("fail")], REACHED)[0]
    assert marked.verdict == "known"
    assert marked.diagnosis == "known (flax-batch-norm-fast-variance + optax-adam-float32-bias-corrections, 0.6 of what they explain)"
    assert "flax-batch-norm-fast-variance: flax.linen.BatchNorm" in marked.reason
    assert "optax-adam-float32-bias-corrections: optax.adam" in marked.reason
    alone = diagnosis.apply_known_differences(cnn, [fake_check("fail")], REACHED)[0]
    assert alone.diagnosis == "known (optax-adam-float32-bias-corrections, 0.6 of what it explains)"


def test_a_library_entry_never_explains_a_check_of_a_run_whose_twin_computes_other_math():
    """Within its members' reach but with the framework's float64 twin failing math parity,
    a covered float32 check stays a failure, diagnosed implementation: the run computes
    other math than the spec's, which no catalogued behaviour explains, and a real bug as
    small as the library's behaviour would otherwise pass as `known` (a flax layer-norm eps
    slip under optax's Adam did, on a port, before this rule)."""
    within = fake_check("fail")  # 3.0 <= 10 x 0.5: known on its own
    assert [c.verdict for c in diagnosis.apply_known_differences(ADAM, [within, _parity("pass", "jax")], REACHED)][0] == "known"
    marked = diagnosis.apply_known_differences(ADAM, [within, _parity("fail", "jax")], REACHED)
    assert marked[0].verdict == "fail"
    assert diagnosis.diagnose(ADAM, marked)[0].diagnosis.startswith("implementation: the float64 twin of jax@cpu differs from the oracle too")
    other = diagnosis.apply_known_differences(ADAM, [within, _parity("fail", "torch")], REACHED)  # another framework's twin: no matter
    assert other[0].verdict == "known"


def test_a_library_entry_explains_a_check_only_as_far_as_its_members_reach():
    """Beyond factor x what the members computing the library's behaviour reach, a covered
    check fails, saying how far beyond, diagnosed as any failing check: implementation
    where the twin differs, rounding where it agrees; where no such member ran, the entry
    explains nothing. Against another run, that run's own tolerance adds."""
    beyond = diagnosis.apply_known_differences(ADAM, [fake_check("fail", ratio=4.0e11)], REACHED)
    assert beyond[0].verdict == "fail"
    assert beyond[0].diagnosis.startswith("beyond what optax-adam-float32-bias-corrections explains (8e+10x")
    with_twin = diagnosis.diagnose(ADAM, [*beyond, _parity("fail", "jax")])  # JAX's twin differs too: different math
    assert with_twin[0].diagnosis.startswith("implementation: the float64 twin of jax@cpu differs from the oracle too")
    assert "; beyond what optax-adam-float32-bias-corrections explains (8e+10x" in with_twin[0].diagnosis
    rounding = diagnosis.diagnose(ADAM, [*beyond, _parity("pass", "jax")])  # the twin agrees: float32 rounding, said so
    assert rounding[0].diagnosis.startswith("rounding: float32 only") and "beyond what optax-adam" in rounding[0].diagnosis
    assert diagnosis.on_rounding_alone(rounding) == []  # no calibrated bound on this fake check: no second look
    unmeasured = diagnosis.apply_known_differences(ADAM, [fake_check("fail")], {})
    assert unmeasured[0].verdict == "fail" and "no members computing its behaviour ran" in unmeasured[0].diagnosis
    pair = checks.Check("loss_curve_envelope", TORCH, JAX_CPU, "fail", "rule", ratio=5.5)  # 1 (torch) + 10 x 0.5 (jax)
    assert [c.verdict for c in diagnosis.apply_known_differences(ADAM, [pair], REACHED)] == ["known"]
    assert [c.verdict for c in diagnosis.apply_known_differences(ADAM, [dataclasses.replace(pair, ratio=6.5)], REACHED)] == ["fail"]


def test_beyond_its_members_reach_a_check_is_known_only_where_the_run_lies_with_its_librarys_formula():
    """Port draws 101-102 of seed 20261216 (docs/measurements.md): a float32 check beyond what
    the library's float32 members reach is known where the run passes that check against the
    reference computing its library's formula over the whole run (lying), a run of the
    reference's own library on the other side; not where it lies beyond its tolerance from
    it, nor where its twin differs, nor where nothing was measured."""
    whole = RunKey("oracle", "cpu", variant="as-jax-whole")
    beyond = fake_check("fail", ratio=4.0e11)
    lying = {(JAX_CPU, "loss_curve_envelope"): (0.14, whole)}
    known = diagnosis.apply_known_differences(ADAM, [beyond], REACHED, lying=lying)[0]
    assert known.verdict == "known" and "beyond its members' reach, 0.14 of its tolerance from oracle@cpu~as-jax-whole" in known.diagnosis
    far = {(JAX_CPU, "loss_curve_envelope"): (1.5, whole)}
    assert diagnosis.apply_known_differences(ADAM, [beyond], REACHED, lying=far)[0].verdict == "fail"
    assert diagnosis.apply_known_differences(ADAM, [beyond, _parity("fail", "jax")], REACHED, lying=lying)[0].verdict == "fail"
    assert diagnosis.apply_known_differences(ADAM, [beyond], {}, lying=lying)[0].verdict == "fail"  # no members: nothing explained
    other = checks.Check("loss_curve_envelope", TORCH, JAX_CPU, "fail", "rule", ratio=4.0e11)  # torch's side: its own library's, not lying
    assert diagnosis.apply_known_differences(ADAM, [other], REACHED, lying=lying)[0].verdict == "fail"


def test_a_library_entry_applies_only_inside_its_version_range(monkeypatch):
    monkeypatch.setattr(catalogue, "_installed", lambda library: "0.0.1")
    assert [c.verdict for c in diagnosis.apply_known_differences(ADAM, [fake_check("fail")], REACHED)] == ["fail"]


def test_a_strict_spec_entry_that_stops_failing_is_reported():
    entry = KnownDifference(framework="jax", check="initial_loss", reason="x" * 20)
    spec = ADAM.model_copy(update={"known_differences": [entry]})
    stale = diagnosis.apply_known_differences(spec, [fake_check("pass", "initial_loss")])
    assert [c.verdict for c in stale] == ["pass", "fail"] and stale[1].name == "known_difference_absent"
    gpu_only = ADAM.model_copy(
        update={"known_differences": [KnownDifference(framework="jax", check="initial_loss", devices=["gpu"], reason="x" * 20)]}
    )
    assert [c.verdict for c in diagnosis.apply_known_differences(gpu_only, [fake_check("fail", "initial_loss")])] == ["fail"]


def test_a_known_difference_of_the_fast_mode_leaves_the_eager_mode_judged():
    fast, eager = RunKey("torch", "cpu", mode="fast"), RunKey("torch", "cpu")
    judged = [
        checks.Check("loss_curve_envelope", fast, ORACLE_KEY, "fail", "rule", ratio=2.0),
        checks.Check("loss_curve_envelope", eager, ORACLE_KEY, "fail", "rule", ratio=2.0),
    ]
    found = diagnosis.apply_known_differences(SGD_CROSS_ENTROPY, judged, REACHED)
    assert [c.verdict for c in found] == ["known", "fail"] and "inductor" in found[0].diagnosis


def _parity(verdict: str, framework: str = "torch") -> checks.Check:
    return checks.Check("math_initial_loss", RunKey(framework, "cpu", precision=FLOAT64), ORACLE_KEY, verdict, "rule", ratio=3e8)


@pytest.mark.parametrize(
    ("twin", "expected"),
    [("fail", "implementation: the float64 twin of torch@cpu"), ("pass", "rounding: float32 only, 2.5x"), (None, "undiagnosed")],
)
def test_every_failing_check_gets_a_diagnosis(twin, expected):
    failing = checks.Check("params_after_step_1", TORCH, ORACLE_KEY, "fail", "rule", first_failure_step=1, ratio=2.5, tensor="dense2.weight")
    found = diagnosis.diagnose(ADAM, [failing, *([_parity(twin)] if twin else [])])
    assert found[0].diagnosis.startswith(expected)
    assert "starts at step 1" in found[0].diagnosis and "largest in dense2.weight after step 1" in found[0].diagnosis
    if twin == "fail":
        assert found[1].diagnosis.startswith("implementation: the float64 twin differs from the oracle")


def test_a_tf32_run_beyond_float32s_spread_is_said_to_be_tf32_rounding():
    tf32 = RunKey("torch", "gpu", precision="tf32")
    failing = checks.Check("params_after_step_1", tf32, ORACLE_KEY, "fail", "rule", first_failure_step=1, ratio=40.0)
    twin = checks.Check("math_initial_loss", RunKey("torch", "gpu", precision=FLOAT64), ORACLE_KEY, "pass", "rule", ratio=0.1)
    found = diagnosis.diagnose(ADAM, [failing, twin])[0].diagnosis
    assert found.startswith("rounding: TF32, products of 10-bit mantissas as --tf32 allows, 40x the calibrated tolerance of float32;")


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_a_diverging_run_is_failed_with_its_step():
    problem = quick_problem("peaks_mlp")
    spec = problem.spec.model_copy(update={"optimizer": problem.spec.optimizer.model_copy(update={"lr": 1e30})})
    outcome = runner.run(type(problem)(**{**problem.__dict__, "spec": spec}), CALIBRATION_KEY)
    assert outcome.status == "failed" and outcome.failed_at_step is not None
    assert f"step {outcome.failed_at_step}" in outcome.reason and not np.isfinite(outcome.losses[outcome.failed_at_step])


def test_an_isolated_run_gives_the_same_bits():
    problem = quick_problem("moons_net")
    short = type(problem)(
        **{**problem.__dict__, "spec": problem.spec.model_copy(update={"training": problem.spec.training.model_copy(update={"epochs": 5})})}
    )
    here = runner.run(short, CALIBRATION_KEY)
    there = in_fresh_process(runner.run, short, CALIBRATION_KEY)
    assert there.status == "ok" and np.array_equal(here.losses, there.losses)


def short_quick(name: str, epochs: int):
    """A spec's quick profile, loaded, and its problem cut to `epochs` epochs (no more than
    the profile's), its parameters snapshot after step 2; on the data its run takes (an
    MNIST spec on the real MNIST test-set files shipped with the harness)."""
    from harness.core.paths import SPECS_DIR
    from harness.inputs.problem import build_problem
    from harness.spec.load import load_spec

    problem = build_problem(load_spec(SPECS_DIR / f"{name}.yaml", "quick"))
    spec = problem.spec
    if epochs > spec.training.epochs:  # the problem's batches stop at the profile's epochs
        raise ValueError(f"short_quick({name!r}, {epochs}): the quick profile runs {spec.training.epochs} epoch(s)")
    checks_section = spec.checks.model_copy(update={"params_after_steps": spec.checks.params_after_steps.model_copy(update={"step": 2})})
    spec = spec.model_copy(update={"training": spec.training.model_copy(update={"epochs": epochs}), "checks": checks_section})
    return load_spec(SPECS_DIR / f"{name}.yaml", "quick"), type(problem)(**{**problem.__dict__, "spec": spec})


def test_short_quick_refuses_more_epochs_than_the_profiles():
    """A problem cut to more epochs than its profile's would run out of batches inside the
    oracle (an IndexError far from the cause): the helper says so instead."""
    with pytest.raises(ValueError, match=r"short_quick\('cnn_norm_mnist', 2\): the quick profile runs 1 epoch\(s\)"):
        short_quick("cnn_norm_mnist", 2)


def test_a_missing_framework_is_skipped_and_the_matrix_goes_on(monkeypatch):
    import io

    from rich.console import Console

    from harness.core import registry

    monkeypatch.setitem(registry.ADAPTERS, "absent", "adapters.no_such_framework")
    loaded, short = short_quick("moons_net", 3)
    keys = plan.matrix_keys(["absent", "numpy", "cupy"], ["cpu", "gpu"])
    result = matrix.run_cells(loaded, short, keys, None, Console(file=io.StringIO()))
    statuses = {k.label: o.status for k, o in result.outcomes.items()}
    assert statuses["absent@cpu"] == "skipped" and "cannot be imported" in result.outcomes[RunKey("absent", "cpu")].reason
    assert statuses["numpy@cpu"] == statuses["oracle@cpu"] == "ok"
    assert statuses["cupy@gpu"] in ("ok", "skipped")
    assert not any(c.involves(RunKey("absent", "cpu")) for c in result.checks)


@pytest.mark.parametrize(
    ("snapshot", "said"),
    [
        (("pass", 0.0), "the parameters agree after step 1 (largest in dense2.weight: no difference)"),
        (("pass", 0.25), "the parameters agree after step 1 (largest in dense2.weight: 0.25x its tolerance)"),
        (("fail", 3.0), "largest in dense2.weight after step 1 (3x its tolerance)"),
    ],
)
def test_where_a_curve_starts_to_fail_says_its_first_snapshot_meaningfully(snapshot, said):
    """A curve that fails late, with the parameters after step 1 identical (a known
    difference whose first step is bitwise the oracle's): not "largest in ... (0x its tolerance)"."""
    verdict, ratio = snapshot
    curve = checks.Check("loss_curve_envelope", TORCH, ORACLE_KEY, "fail", "rule", first_failure_step=31, ratio=2.0)
    step = checks.Check("params_after_step_1", TORCH, ORACLE_KEY, verdict, "rule", ratio=ratio, tensor="dense2.weight")
    found = diagnosis.diagnose(ADAM, [curve, step])
    assert found[0].diagnosis.endswith(f"starts at step 31; {said}") and "0x" not in found[0].diagnosis


def test_a_ratio_is_said_the_same_everywhere():
    from harness.verdict.bound import times_tolerance

    assert [times_tolerance(r) for r in (0.0, 2.5, 1e-5, float("inf"))] == [
        "no difference",
        "2.5x its tolerance",
        "1e-05x its tolerance",
        "its tolerance is zero",
    ]


def test_a_check_needing_a_librarys_float32_members_names_that_library_until_they_run():
    """diagnosis.unmeasured_libraries: a failing check a library entry covers with none of
    its library's float32 members run, by the library whose members it needs (the library
    look runs them); one they measured needs none, nor one that no entry covers."""
    unmeasured = diagnosis.diagnose(ADAM, diagnosis.apply_known_differences(ADAM, [fake_check("fail")], {}))
    assert diagnosis.unmeasured_libraries(ADAM, unmeasured) == {"jax": unmeasured}
    beyond = diagnosis.diagnose(ADAM, diagnosis.apply_known_differences(ADAM, [fake_check("fail", ratio=4.0e11)], REACHED))
    assert beyond[0].verdict == "fail" and diagnosis.unmeasured_libraries(ADAM, beyond) == {}
    assert diagnosis.unmeasured_libraries(ADAM, [fake_check("fail")]) == {}  # no entry covers it: nothing to measure


def test_a_librarys_float32_members_run_only_where_a_check_needs_them_and_give_the_same_verdicts(monkeypatch, members_from_the_start):
    """Issue 54: the float32 members computing a library's catalogued behaviour bound only
    the failing checks its entries cover (diagnosis.reach), so they run after a first
    judgement, where such a check fails (calibration.library_look). On peaks' Adam, optax's
    float32 bias corrections move JAX's runs from step 1: its members run, and every check
    is what it is with them planned from the start (as before), ratio and diagnosis alike."""
    import io

    from rich.console import Console

    from harness.calibrate import calibration, roles

    loaded, short = short_quick("peaks_mlp", 4)
    keys = plan.matrix_keys(["jax", "numpy"], ["cpu"])
    members_from_the_start(roles.ALL)  # every member from the start (tests/test_first_look.py: the looks)
    monkeypatch.setattr(roles, "FIRST_LOOK", 10**6)  # and every one of a library's on its first look

    def judged():
        out = io.StringIO()
        result = matrix.run_cells(loaded, short, keys, None, Console(file=out, width=300), repeats=1)
        return [(c.name, c.a, c.b, c.verdict, c.ratio, c.diagnosis) for c in result.checks], out.getvalue()

    lazy, said = judged()
    assert "running 8 members computing jax's catalogued behaviour" in said
    assert any(verdict == "known" and "optax-adam-float32-bias-corrections" in why for _, _, _, verdict, _, why in lazy)
    planned = calibration.jobs

    def eager(loaded, problem, keys, twins, scheme=roles.ORACLE_SCHEME):  # the plan before the library look: its members from the start
        return [*planned(loaded, problem, keys, twins, scheme), *roles.library32_jobs(loaded, problem, keys, scheme)]

    monkeypatch.setattr(calibration, "jobs", eager)
    before, said = judged()
    assert "where a library entry covers them" not in said and before == lazy


def _run(key: RunKey, losses, bias: float = 0.0, diverged_at: int | None = None) -> runner.Outcome:
    """A finished run of ten steps (or one that diverged at `diverged_at`): its losses, a
    tensor after steps 1 and 8, and its outputs and metric where it trained to the end."""
    losses = np.array(losses, np.float64)
    snap = {s: {"w": np.full(3, 1.0 + bias * s)} for s in (1, 8)}
    if diverged_at is not None:
        losses[diverged_at:] = np.nan
        snap = {s: p if s < diverged_at else {"w": np.full(3, np.nan)} for s, p in snap.items()}
        reason = f"diverged: non-finite loss or parameters at step {diverged_at}"
        return runner.Outcome(key, "failed", reason, losses=losses, snapshots=snap, initial_outputs=np.zeros(2), failed_at_step=diverged_at)
    out = np.full(2, bias)
    return runner.Outcome(
        key, "ok", losses=losses, snapshots=snap, initial_outputs=np.zeros(2), final_outputs=out, metrics={"train_loss": losses[-1]}
    )


CURVE = np.linspace(2.0, 1.0, 10)


def test_a_spread_whose_member_diverges_bounds_only_the_steps_before_its_divergence():
    from harness.calibrate.spread import measure

    reference = _run(ORACLE_KEY, CURVE)
    ok = _run(CALIBRATION_KEY, CURVE * (1 + 1e-6), bias=1e-6)
    gone = _run(dataclasses.replace(CALIBRATION_KEY, variant="order1"), CURVE * (1 + 2e-6), bias=2e-6, diverged_at=6)
    whole = measure(reference, [ok], "float32")
    assert whole.finite_steps is None and len(whole.curve) == 10 and sorted(whole.params) == [1, 8] and np.isfinite(whole.final_outputs)
    spread = measure(reference, [ok, gone], "float32")
    assert spread.finite_steps == 6 and spread.diverged == {gone.key.label: 6}
    assert len(spread.curve) == 6 and np.allclose(spread.curve, 2e-6)  # the diverged member's own finite steps
    assert sorted(spread.params) == [1]  # after step 8 nothing is bounded
    assert spread.final_outputs == np.inf and spread.metrics == {}
    assert "at step 6" in spread.unbounded and gone.key.label in spread.unbounded
    raised = runner.Outcome(gone.key, "failed", "raised", losses=None)  # a failure that is no divergence bounds nothing
    assert measure(reference, [ok, raised], "float32") is None


def test_where_a_member_diverged_the_envelope_judges_the_steps_before_and_skips_the_rest():
    from harness.calibrate.spread import measure

    spec = quick_problem("peaks_mlp").spec
    reference = _run(ORACLE_KEY, CURVE)
    spread = measure(reference, [_run(CALIBRATION_KEY, CURVE * (1 + 1e-6)), _run(CALIBRATION_KEY, CURVE * (1 + 1e-6), diverged_at=6)], "float32")
    late = _run(TORCH, np.concatenate([CURVE[:6] * (1 + 1e-6), CURVE[6:] * 3]))  # far off only after step 5
    found = {c.name: c for c in checks.envelope_checks(spec, late, reference, spread)}
    assert found["loss_curve_envelope"].verdict == "pass" and "judged over steps 0-5" in found["loss_curve_envelope"].tolerance
    assert found["final_outputs"].verdict == "skipped" and found["final_outputs"].reason == spread.unbounded
    early = _run(TORCH, np.concatenate([CURVE[:3], CURVE[3:] * 3]))  # off from step 3: judged, and fails
    assert checks.envelope_checks(spec, early, reference, spread)[0].verdict == "fail"


def test_a_run_may_diverge_no_earlier_than_its_members():
    from harness.calibrate.spread import measure
    from harness.verdict.rules import float32_divergence

    spec = quick_problem("peaks_mlp").spec
    reference = _run(ORACLE_KEY, CURVE)
    members = [_run(CALIBRATION_KEY, CURVE * (1 + 1e-6)), _run(CALIBRATION_KEY, CURVE * (1 + 1e-6), diverged_at=6)]
    spread, trained = measure(reference, members, "float32"), measure(reference, members[:1], "float32")
    for at, cal, verdict in ((7, spread, "pass"), (6, spread, "pass"), (4, spread, "fail"), (7, trained, "fail")):
        run = _run(TORCH, CURVE * (1 + 1e-6), diverged_at=at)
        found = {c.name: c for c in float32_divergence(spec, run, reference, cal)}
        assert found["divergence"].verdict == verdict, (at, cal.diverged)
        assert found["loss_curve_envelope"].verdict == "pass"  # its finite steps are the members'
        if verdict == "fail":
            assert found["divergence"].first_failure_step == at
    bent = _run(TORCH, np.concatenate([CURVE[:3], CURVE[3:] * 3]), diverged_at=7)  # off before it diverged
    assert {c.name: c.verdict for c in float32_divergence(spec, bent, reference, spread)}["loss_curve_envelope"] == "fail"


def test_a_twin_that_diverged_as_its_members_do_is_still_judged_by_math_parity_over_its_finite_steps():
    """A float64 twin that diverges no earlier than the oracle's reordered members passes its
    divergence check; a difference of math before that is still caught: its initial outputs,
    loss, the snapshots it kept finite and its curve up to its divergence are judged, and
    its final outputs are skipped with its reason. Before, a diverged twin had no math parity
    at all, so a porting bug that diverged as the members did passed every twin check."""
    from harness.calibrate.spread import Calibration, measure
    from harness.verdict.rules import math_parity, twin_divergence

    spec = quick_problem("peaks_mlp").spec
    spec = spec.model_copy(
        update={"checks": spec.checks.model_copy(update={"params_after_steps": spec.checks.params_after_steps.model_copy(update={"step": 8})})}
    )
    oracle = _run(ORACLE_KEY, CURVE)
    members = [_run(CALIBRATION_KEY, CURVE * (1 + 1e-15), bias=1e-15), _run(CALIBRATION_KEY, CURVE * (1 + 2e-15), bias=2e-15, diverged_at=6)]
    cal = Calibration(float32=None, float64=measure(oracle, members, "float64"), twin_reference=oracle)
    twin = RunKey("torch", "cpu", precision=FLOAT64)

    def judged(run):
        return {c.name: c for c in (*math_parity(spec, run, cal), *twin_divergence(spec, run, cal))}

    honest = judged(_run(twin, CURVE * (1 + 1e-15), bias=1e-15, diverged_at=7))
    assert honest["math_divergence"].verdict == "pass"
    assert {n: c.verdict for n, c in honest.items() if n != "math_divergence"} == {
        "math_initial_outputs": "pass",
        "math_initial_loss": "pass",
        "math_params_after_step_1": "pass",
        "math_params_after_step_8": "skipped",  # the twin's own tensors there are no longer finite
        "math_loss_curve": "pass",
        "math_final_outputs": "skipped",
    }, honest
    assert "judged over its finite steps" in honest["math_final_outputs"].reason
    later = judged(_run(twin, CURVE * (1 + 1e-15), bias=1e-15, diverged_at=9))  # finite after step 8, where no member bounds it
    assert later["math_params_after_step_8"].verdict == "skipped" and later["math_params_after_step_8"].reason == cal.float64.unbounded
    bent = _run(twin, np.concatenate([CURVE[:3], CURVE[3:] * 1.01]), diverged_at=7)  # another curve from step 3
    found = judged(bent)
    assert found["math_divergence"].verdict == "pass" and found["math_loss_curve"].verdict == "fail"
    assert found["math_loss_curve"].first_failure_step == 3
    stepped = _run(twin, CURVE * (1 + 1e-15), bias=1e-6, diverged_at=7)  # another step from the first update
    assert judged(stepped)["math_params_after_step_1"].verdict == "fail"
    at_once = _run(twin, CURVE, diverged_at=0)  # nothing finite to judge: its divergence alone
    assert math_parity(spec, at_once, cal) == []
    raised = runner.Outcome(twin, "failed", "raised")
    assert math_parity(spec, raised, cal) == []


def test_a_tensor_check_whose_error_is_not_finite_fails():
    """NaN compares false with every bound: a non-finite value on either side is a failure,
    never a pass."""
    from harness.calibrate.spread import measure

    spread = measure(_run(ORACLE_KEY, CURVE), [_run(CALIBRATION_KEY, CURVE * (1 + 1e-6), bias=1e-6)], "float32")
    for bad in (np.nan, np.inf):
        found = checks.tensor_check("params_after_step_1", TORCH, ORACLE_KEY, [np.array([1.0, bad])], [np.ones(2)], [1e-6], 10.0, spread)
        assert found.verdict == "fail", bad
    fine = checks.tensor_check("params_after_step_1", TORCH, ORACLE_KEY, [np.ones(2)], [np.ones(2)], [1e-6], 10.0, spread)
    assert fine.verdict == "pass"


def test_a_float32_failure_whose_twin_failed_without_a_ratio_is_diagnosed_by_the_twins_reason():
    """A twin that diverged where the oracle trained fails math parity with no ratio (a
    divergence is not an error over a tolerance): the float32 run's failing check is
    implementation, said with the twin's reason, not a crash on the missing ratio."""
    failing = checks.Check("loss_curve_envelope", TORCH, ORACLE_KEY, "fail", "rule", ratio=2.5)
    twin = RunKey("torch", "cpu", precision=FLOAT64)
    diverged = checks.Check("math_divergence", twin, ORACLE_KEY, "fail", "rule", reason="diverged at step 16")
    found = diagnosis.diagnose(ADAM, [failing, diverged])
    said = "implementation: the float64 twin of torch@cpu differs from the oracle too (math_divergence, diverged at step 16)"
    assert found[0].diagnosis.startswith(said)


def test_finite_parameters_whose_forward_overflows_diverged_after_the_last_step():
    """A run whose parameters stay finite but whose own forward pass overflows (non-finite
    outputs or whole-set metrics) diverged after its last step: a record never holds an ok run
    with a metric that is not finite (harness/gate/consistency.py)."""
    from types import SimpleNamespace

    def finished(outputs, metric):
        outcome = runner.Outcome(TORCH, "ok", losses=CURVE.copy(), final_params={"w": np.ones(3)})
        adapter = SimpleNamespace(predict=lambda trainer, x: np.full(2, outputs))
        problem = SimpleNamespace(probe=None, x_train=None, x_val=None, port=None)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(runner, "_metrics", lambda *args: {"train_loss": metric})
            runner._finish(adapter, None, problem, outcome, metrics=True)
        return outcome

    fine = finished(0.5, 1.0)
    assert fine.status == "ok" and fine.metrics == {"train_loss": 1.0} and fine.failed_at_step is None
    for outputs, metric in ((np.inf, 1.0), (0.5, np.inf), (0.5, np.nan)):
        gone = finished(outputs, metric)
        assert gone.status == "failed" and gone.failed_at_step == len(CURVE), (outputs, metric)
        assert gone.final_outputs is None and gone.metrics == {} and "after its last step" in gone.reason


def test_a_run_that_diverged_as_its_members_do_fails_no_command():
    from types import SimpleNamespace

    from harness.report.table import diverged_as_members

    passing = SimpleNamespace(name="divergence", verdict="pass")
    assert diverged_as_members(SimpleNamespace(failed_at_step=6, checks=[]), member=True)
    assert diverged_as_members(SimpleNamespace(failed_at_step=7, checks=[passing]), member=False)
    assert not diverged_as_members(
        SimpleNamespace(failed_at_step=4, checks=[checks.Check("divergence", TORCH, ORACLE_KEY, "fail", "r")]), member=False
    )
    assert not diverged_as_members(SimpleNamespace(failed_at_step=None, checks=[passing]), member=True)  # raised: a failure
